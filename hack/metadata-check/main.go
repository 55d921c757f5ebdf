// metadata-check reads a device metadata file (KEP-5304) with the upstream consumer
// library, k8s.io/dynamic-resource-allocation v0.37.2 (Kubernetes 1.37), and checks that
// the kubelet plugin helper's own encoder writes the same bytes for what it decoded.
//
// Usage: metadata-check FILE...
//
// For each file it prints the decoded object as JSON (one line) on stdout, or the reason on
// stderr. Exit 0: every file decoded and re-encodes to exactly its bytes; 1: otherwise.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/api/metadata/install"
	"k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

func check(path string, encoder runtime.Encoder) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	// What a workload does: the first document of a version it knows, as the internal type
	// (the helper's own reader does the same before it updates a file).
	var internal metadata.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &internal); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	// What the helper writes for that object: the pretty JSON serializer, then a newline.
	encoded, err := runtime.Encode(encoder, &internal)
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	encoded = append(encoded, '\n')
	if !bytes.Equal(encoded, data) {
		return fmt.Errorf("the helper would write other bytes:\n--- helper\n%s--- file\n%s", encoded, data)
	}
	var versioned v1beta1.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &versioned); err != nil {
		return fmt.Errorf("decode as v1beta1: %w", err)
	}
	line, err := json.Marshal(versioned)
	if err != nil {
		return err
	}
	fmt.Println(string(line))
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: metadata-check FILE...")
		os.Exit(2)
	}
	scheme := install.NewScheme()
	codecs := serializer.NewCodecFactory(scheme)
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		fmt.Fprintln(os.Stderr, "no JSON serializer")
		os.Exit(2)
	}
	encoder := codecs.EncoderForVersion(info.PrettySerializer, v1beta1.SchemeGroupVersion)
	failed := false
	for _, path := range os.Args[1:] {
		if err := check(path, encoder); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}
