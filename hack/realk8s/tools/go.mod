// Test tooling shared by the per-minor modules (hack/realk8s/v1.*): each one builds these
// programs against its own Kubernetes version through `replace ... => ../tools`, so the
// versions below are only floors; the building module's go.mod and go.sum decide.
module github.com/dra-agent/dra-agent/hack/realk8s/tools

go 1.25.0

require (
	k8s.io/api v0.35.4
	k8s.io/apimachinery v0.35.4
	k8s.io/apiserver v0.35.4
	k8s.io/dynamic-resource-allocation v0.35.4
	k8s.io/kubernetes v1.35.4
)
