# Sourced by the hack/*-check.sh scripts; the caller defines die().
#
# The machine's Go toolchain (>= 1.26, /usr/local/go) first: /usr/bin/go may be Debian's older
# golang-go, which builds none of the checkers.
go_bin() {
    if [ -x /usr/local/go/bin/go ]; then
        echo /usr/local/go/bin/go
    elif command -v go >/dev/null 2>&1; then
        command -v go
    else
        die "no Go toolchain: put the machine's go (>= 1.26) on PATH"
    fi
}
