// Command nodelocaldns-sbom writes the software bill of materials (SPDX 2.3
// JSON) of a nodelocaldns image from the image itself, a docker-archive
// tarball (buildah push docker-archive:..., docker save):
//
//	nodelocaldns-sbom -image nodelocaldns.tar -name registry.example.com/nodelocaldns:v0.1.0 > nodelocaldns.spdx.json
//
// The Go modules and toolchain come from the binary's build information,
// the Debian packages from the base's dpkg status (internal/sbom).
// test/e2e/images.sh and test/image/build.sh write one beside each image
// they build. Exit 1 when the image cannot be read.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/nodelocaldns/nodelocaldns/internal/sbom"
)

func main() {
	image := flag.String("image", "", "the image, a docker-archive tarball")
	name := flag.String("name", "nodelocaldns", "the reference the image was built as")
	binary := flag.String("binary", "nodelocaldns", "the Go binary's path in the image, without the leading /")
	flag.Parse()
	if *image == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: nodelocaldns-sbom -image ARCHIVE.tar [-name REF] [-binary PATH] > SBOM.spdx.json")
		os.Exit(2)
	}
	img, err := sbom.ReadImage(*image, *binary)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodelocaldns-sbom:", err)
		os.Exit(1)
	}
	out, err := img.SPDX(*name)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodelocaldns-sbom:", err)
		os.Exit(1)
	}
	if _, err := os.Stdout.Write(append(out, '\n')); err != nil {
		os.Exit(1)
	}
}
