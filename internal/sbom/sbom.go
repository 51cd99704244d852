// Package sbom writes the software bill of materials of the nodelocaldns
// image: an SPDX 2.3 JSON document listing what the image was built from,
// read out of the built image itself (a docker-archive tarball, as buildah
// and docker save write it): the Go modules with their versions and
// checksums from the binary's build information, the Go toolchain, and the
// Debian packages of the base from dpkg's status file. Nothing is taken
// from the source tree, so the list is what runs.
//
// It reads files and writes JSON; it does not build, pull or sign images.
// The output is deterministic for one image: the creation time is the
// image's (or, without one, the commit time the binary was built from).
package sbom

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// Image is what an image holds that the bill lists.
type Image struct {
	// Binary is the Go binary's build information.
	Binary *buildinfo.BuildInfo
	// BinaryPath is where the binary is in the image.
	BinaryPath string
	// Debs are the installed Debian packages of the base.
	Debs []Deb
	// Digest is the image's config digest (its ID), "sha256:...".
	Digest string
	// Created is when the image was built, from its config.
	Created string
}

// Deb is one installed Debian package.
type Deb struct {
	Name, Version, Arch, Source string
}

// ReadImage reads a docker-archive tarball: the binary at binPath (for
// example "nodelocaldns", no leading slash) and /var/lib/dpkg/status, from
// the last layer that has each.
func ReadImage(archive, binPath string) (*Image, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	members, err := readTar(f, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", archive, err)
	}
	var manifest []struct {
		Config string
		Layers []string
	}
	if err := json.Unmarshal(members["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		return nil, fmt.Errorf("%s: manifest.json: want one image, %v", archive, err)
	}
	want := map[string]bool{binPath: true, "var/lib/dpkg/status": true}
	found := map[string][]byte{}
	for _, l := range manifest[0].Layers {
		files, err := readLayer(members[l], want)
		if err != nil {
			return nil, fmt.Errorf("%s: layer %s: %w", archive, l, err)
		}
		for k, v := range files {
			found[k] = v // later layers win
		}
	}
	bin, ok := found[binPath]
	if !ok {
		return nil, fmt.Errorf("%s: no /%s in any layer", archive, binPath)
	}
	bi, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		return nil, fmt.Errorf("%s: /%s: %w", archive, binPath, err)
	}
	img := &Image{Binary: bi, BinaryPath: "/" + binPath, Digest: "sha256:" + strings.TrimSuffix(path.Base(manifest[0].Config), ".json")}
	var config struct{ Created string }
	if err := json.Unmarshal(members[manifest[0].Config], &config); err == nil {
		img.Created = config.Created
	}
	if st, ok := found["var/lib/dpkg/status"]; ok {
		img.Debs = ParseDpkgStatus(st)
	}
	return img, nil
}

// readTar returns the regular files of a tar stream whose names are in
// want (all of them when want is nil).
func readTar(r io.Reader, want map[string]bool) (map[string][]byte, error) {
	out := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if h.Typeflag != tar.TypeReg || (want != nil && !want[name]) {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		out[name] = b
	}
}

// readLayer reads one layer, plain or gzip-compressed.
func readLayer(layer []byte, want map[string]bool) (map[string][]byte, error) {
	if layer == nil {
		return nil, errors.New("not in the archive")
	}
	var r io.Reader = bytes.NewReader(layer)
	if len(layer) > 2 && layer[0] == 0x1f && layer[1] == 0x8b {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, err
		}
		r = zr
	}
	return readTar(r, want)
}

// ParseDpkgStatus lists the installed packages of a dpkg status file.
func ParseDpkgStatus(status []byte) []Deb {
	var out []Deb
	var cur Deb
	installed := false
	flush := func() {
		if cur.Name != "" && installed {
			if cur.Source == "" {
				cur.Source = cur.Name
			}
			out = append(out, cur)
		}
		cur, installed = Deb{}, false
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			flush()
			continue
		}
		k, v, ok := strings.Cut(line, ": ")
		if !ok || strings.HasPrefix(line, " ") {
			continue
		}
		switch k {
		case "Package":
			cur.Name = v
		case "Version":
			cur.Version = v
		case "Architecture":
			cur.Arch = v
		case "Source":
			cur.Source, _, _ = strings.Cut(v, " ") // "src (version)"
		case "Status":
			installed = strings.HasSuffix(v, " installed")
		}
	}
	flush()
	return out
}
