# Shared by up.sh, down.sh and node-kubeconfig.sh (sourced, not run).

# ours PID NAME: PID is alive and still the binary NAME we started. Pids are reused, and a
# process that exited stays a zombie (kill -0 succeeds) until its parent reaps it; a zombie
# has an empty cmdline.
ours() {
    local pid="$1" name="$2"
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] &&
        tr '\0' '\n' <"/proc/$pid/cmdline" | head -1 | grep -q "/$name\$"
}

# client_cert PKI CN O NAME: an EC P-256 client certificate NAME.crt/NAME.key signed by the
# cluster's CA. CN is the user name and O the group the x509 authenticator reads.
client_cert() {
    local pki="$1" cn="$2" o="$3" name="$4" subj
    subj="/CN=$cn"
    [ -z "$o" ] || subj="/O=$o$subj"
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$name.key" 2>/dev/null &&
    openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null &&
    printf 'extendedKeyUsage=clientAuth\n' >"$pki/$name.ext" &&
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
        -CAcreateserial -days 7 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null &&
    rm -f "$pki/$name.csr" "$pki/$name.ext"
}

# write_kubeconfig SERVER PKI NAME OUT: a kubeconfig with the CA and NAME's client certificate
# embedded as data, readable by its owner only.
write_kubeconfig() {
    local server="$1" pki="$2" name="$3" out="$4"
    (
        umask 077
        cat >"$out.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: realk8s
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 <"$pki/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(base64 -w0 <"$pki/$name.crt")
    client-key-data: $(base64 -w0 <"$pki/$name.key")
contexts:
- name: $name
  context: {cluster: realk8s, user: $name}
current-context: $name
EOF
        mv "$out.tmp" "$out"
    )
}
