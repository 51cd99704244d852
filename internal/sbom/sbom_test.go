package sbom

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const status = `Package: iptables
Status: install ok installed
Priority: optional
Architecture: amd64
Source: iptables (1.8.9-2)
Version: 1.8.9-2
Description: administration tools for packet filtering and NAT
 iptables is the userspace command line program
 Package: not-a-field

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0

Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u10
`

func tarOf(t *testing.T, files map[string][]byte, gz bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w interface {
		Write([]byte) (int, error)
		Close() error
	} = nopCloser{&buf}
	if gz {
		w, _ = gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	}
	tw := tar.NewWriter(w)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type nopCloser struct{ *bytes.Buffer }

func (nopCloser) Close() error { return nil }

// archive writes a docker-archive as buildah writes one: the base layer
// with dpkg's status and a stand-in binary, a later (compressed) layer with
// the real one (this test binary, a Go binary with modules).
func archive(t *testing.T) (string, *buildinfo.BuildInfo) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	bi, err := buildinfo.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	manifest, _ := json.Marshal([]map[string]any{{"Config": "0123abcd.json", "Layers": []string{"base.tar", "top.tar"}}})
	p := filepath.Join(t.TempDir(), "image.tar")
	data := tarOf(t, map[string][]byte{
		"manifest.json": manifest,
		"0123abcd.json": []byte(`{"created":"2026-11-28T23:49:01.123456789Z"}`),
		"base.tar":      tarOf(t, map[string][]byte{"var/lib/dpkg/status": []byte(status), "nodelocaldns": []byte("not this one")}, false),
		"top.tar":       tarOf(t, map[string][]byte{"./nodelocaldns": bin}, true),
	}, false)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, bi
}

func TestParseDpkgStatus(t *testing.T) {
	got := ParseDpkgStatus([]byte(status))
	want := []Deb{{"iptables", "1.8.9-2", "amd64", "iptables"}, {"libc6", "2.36-9+deb12u10", "amd64", "libc6"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

// TestSPDXFromImage: the bill lists the image, the binary of the last layer
// that has it, the Go toolchain, every module of its build information with
// version and sum, and the installed Debian packages, and is the same bytes
// every time.
func TestSPDXFromImage(t *testing.T) {
	p, bi := archive(t)
	img, err := ReadImage(p, "nodelocaldns")
	if err != nil {
		t.Fatal(err)
	}
	if img.Digest != "sha256:0123abcd" || img.Binary.Main.Path != bi.Main.Path || len(img.Debs) != 2 {
		t.Fatalf("image %+v", img)
	}
	out, err := img.SPDX("registry.example.com/nodelocaldns:test")
	if err != nil {
		t.Fatal(err)
	}
	again, _ := img.SPDX("registry.example.com/nodelocaldns:test")
	if !bytes.Equal(out, again) {
		t.Error("two bills of the same image differ")
	}
	var doc document
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.SPDXVersion != "SPDX-2.3" || doc.DataLicense != "CC0-1.0" || !strings.HasSuffix(doc.DocumentNamespace, "/sha256:0123abcd") || doc.CreationInfo.Created != "2026-11-28T23:49:01Z" {
		t.Errorf("document %+v", doc)
	}
	byName := map[string]pkg{}
	ids := map[string]bool{}
	for _, p := range doc.Packages {
		byName[p.Name] = p
		if ids[p.SPDXID] {
			t.Errorf("SPDXID %s twice", p.SPDXID)
		}
		ids[p.SPDXID] = true
	}
	for _, m := range bi.Deps {
		if p, ok := byName[m.Path]; !ok || p.VersionInfo != m.Version || (m.Sum != "" && p.Comment != "go.sum "+m.Sum) {
			t.Errorf("module %s %s: %+v", m.Path, m.Version, p)
		}
	}
	if p := byName["stdlib"]; p.VersionInfo != bi.GoVersion {
		t.Errorf("stdlib %+v, want %s", p, bi.GoVersion)
	}
	if p := byName["iptables"]; p.VersionInfo != "1.8.9-2" || len(p.ExternalRefs) != 1 || p.ExternalRefs[0].Locator != "pkg:deb/debian/iptables@1.8.9-2?arch=amd64&distro=debian-12" {
		t.Errorf("iptables %+v", p)
	}
	if _, ok := byName["removed-one"]; ok {
		t.Error("a package not installed is listed")
	}
	if want := 3 + len(bi.Deps) + 2; len(doc.Packages) != want || len(doc.Relationships) != want {
		t.Errorf("%d packages, %d relationships, want %d each", len(doc.Packages), len(doc.Relationships), want)
	}
	for _, r := range doc.Relationships {
		if r.Element != "SPDXRef-DOCUMENT" && !ids[r.Element] || !ids[r.Related] {
			t.Errorf("relationship %+v names an unknown element", r)
		}
	}
}

func TestReadImageErrors(t *testing.T) {
	p, _ := archive(t)
	if _, err := ReadImage(p, "usr/bin/missing"); err == nil || !strings.Contains(err.Error(), "no /usr/bin/missing") {
		t.Errorf("missing binary: %v", err)
	}
	if _, err := ReadImage(p, "var/lib/dpkg/status"); err == nil {
		t.Error("a file that is not a Go binary was read as one")
	}
	bad := filepath.Join(t.TempDir(), "bad.tar")
	_ = os.WriteFile(bad, []byte("not a tar"), 0o644)
	if _, err := ReadImage(bad, "nodelocaldns"); err == nil {
		t.Error("not a tarball: no error")
	}
}
