package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// emulators maps the architectures the stock node-local-dns image ships,
// other than this machine's, to Debian's qemu-user-static emulator for each.
var emulators = map[string]string{
	"arm64":   "qemu-aarch64-static",
	"arm":     "qemu-arm-static",
	"ppc64le": "qemu-ppc64le-static",
	"s390x":   "qemu-s390x-static",
}

// TestEndToEndUnderEmulation is TestEndToEndWithDig with the daemon built
// for another architecture and run under user-mode emulation: the listed
// architectures of NLD_CROSS_ARCHES (make crossarch sets it to all four;
// docs/crossarch.md). It answers misses from both upstreams over UDP and
// TCP and hits from its cache, as on amd64. Without NLD_CROSS_ARCHES it
// skips: make test stays on this machine's architecture.
func TestEndToEndUnderEmulation(t *testing.T) {
	arches := strings.Fields(os.Getenv("NLD_CROSS_ARCHES"))
	if len(arches) == 0 {
		t.Skip("NLD_CROSS_ARCHES not set: make crossarch runs this for arm64, arm, ppc64le and s390x")
	}
	for _, arch := range arches {
		t.Run(arch, func(t *testing.T) {
			emu, ok := emulators[arch]
			if !ok {
				t.Fatalf("NLD_CROSS_ARCHES: %q is not one of the stock image's other architectures (arm64 arm ppc64le s390x)", arch)
			}
			emu = need(t, emu)
			endToEndWithDig(t, []string{emu, crossBinary(t, arch)})
		})
	}
}

// crossBinary is the daemon built for arch: NLD_CROSS_BINDIR/nodelocaldns-ARCH
// when make crossarch has built it (as the Dockerfile does), else built here.
func crossBinary(t *testing.T, arch string) string {
	t.Helper()
	if dir := os.Getenv("NLD_CROSS_BINDIR"); dir != "" {
		bin := filepath.Join(dir, "nodelocaldns-"+arch)
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("NLD_CROSS_BINDIR: %v", err)
		}
		return bin
	}
	bin := filepath.Join(t.TempDir(), "nodelocaldns-"+arch)
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "../../cmd/nodelocaldns")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("GOARCH=%s go build: %v\n%s", arch, err, out)
	}
	return bin
}
