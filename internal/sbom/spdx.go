package sbom

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"time"
)

// The SPDX 2.3 JSON fields used (spdx.github.io/spdx-spec/v2.3).
type document struct {
	SPDXVersion       string         `json:"spdxVersion"`
	DataLicense       string         `json:"dataLicense"`
	SPDXID            string         `json:"SPDXID"`
	Name              string         `json:"name"`
	DocumentNamespace string         `json:"documentNamespace"`
	CreationInfo      creationInfo   `json:"creationInfo"`
	Packages          []pkg          `json:"packages"`
	Relationships     []relationship `json:"relationships"`
}

type creationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type pkg struct {
	Name             string        `json:"name"`
	SPDXID           string        `json:"SPDXID"`
	VersionInfo      string        `json:"versionInfo,omitempty"`
	Supplier         string        `json:"supplier,omitempty"`
	DownloadLocation string        `json:"downloadLocation"`
	FilesAnalyzed    bool          `json:"filesAnalyzed"`
	PrimaryPurpose   string        `json:"primaryPackagePurpose,omitempty"`
	Checksums        []checksum    `json:"checksums,omitempty"`
	ExternalRefs     []externalRef `json:"externalRefs,omitempty"`
	Comment          string        `json:"comment,omitempty"`
}

type checksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

type externalRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type relationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

var idUnsafe = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

func spdxID(kind, name string) string {
	return "SPDXRef-" + kind + "-" + strings.Trim(idUnsafe.ReplaceAllString(name, "-"), "-")
}

// setting is one of the binary's build settings (vcs.revision, GOARCH...).
func (img *Image) setting(key string) string {
	for _, s := range img.Binary.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}

// SPDX returns the image's bill of materials as SPDX 2.3 JSON. name is the
// image reference it was built as (e.g. registry.example.com/nodelocaldns:v0.1.0).
func (img *Image) SPDX(name string) ([]byte, error) {
	bi := img.Binary
	arch := img.setting("GOARCH")
	created := img.Created
	if t, err := time.Parse(time.RFC3339Nano, created); err == nil {
		created = t.UTC().Format(time.RFC3339)
	} else if created = img.setting("vcs.time"); created == "" {
		created = time.Unix(0, 0).UTC().Format(time.RFC3339)
	}
	doc := document{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT",
		Name:              name,
		DocumentNamespace: "https://github.com/nodelocaldns/nodelocaldns/sbom/" + url.PathEscape(name) + "/" + img.Digest,
		CreationInfo:      creationInfo{Created: created, Creators: []string{"Tool: nodelocaldns internal/sbom", "Organization: nodelocaldns"}},
	}
	imageID := "SPDXRef-Image"
	doc.Packages = append(doc.Packages, pkg{
		Name: name, SPDXID: imageID, VersionInfo: img.Digest, DownloadLocation: "NOASSERTION", PrimaryPurpose: "CONTAINER",
		Checksums: []checksum{{"SHA256", strings.TrimPrefix(img.Digest, "sha256:")}},
		Comment:   "the image's config digest (image ID); the registry's manifest digest is what a pod's imageID shows",
	})
	doc.Relationships = append(doc.Relationships, relationship{"SPDXRef-DOCUMENT", "DESCRIBES", imageID})

	binID := spdxID("Binary", bi.Main.Path)
	version := bi.Main.Version
	if rev := img.setting("vcs.revision"); rev != "" && (version == "" || version == "(devel)") {
		version = rev
	}
	doc.Packages = append(doc.Packages, pkg{
		Name: bi.Main.Path, SPDXID: binID, VersionInfo: version, DownloadLocation: "git+https://" + bi.Main.Path,
		PrimaryPurpose: "APPLICATION",
		ExternalRefs:   []externalRef{{"PACKAGE-MANAGER", "purl", goPurl(bi.Main.Path, version, arch)}},
		Comment:        fmt.Sprintf("%s in the image; vcs.revision %s, vcs.modified %s, built by %s for linux/%s", img.BinaryPath, img.setting("vcs.revision"), img.setting("vcs.modified"), bi.GoVersion, arch),
	})
	doc.Relationships = append(doc.Relationships, relationship{imageID, "CONTAINS", binID})
	goID := spdxID("Go", "stdlib")
	doc.Packages = append(doc.Packages, pkg{
		Name: "stdlib", SPDXID: goID, VersionInfo: bi.GoVersion, DownloadLocation: "https://go.dev/dl/",
		ExternalRefs: []externalRef{{"PACKAGE-MANAGER", "purl", goPurl("stdlib", bi.GoVersion, arch)}},
		Comment:      "the Go standard library and runtime linked into the binary",
	})
	doc.Relationships = append(doc.Relationships, relationship{binID, "STATIC_LINK", goID})
	for _, m := range bi.Deps {
		if m.Replace != nil {
			m = m.Replace
		}
		id := spdxID("Go", m.Path+"-"+m.Version)
		p := pkg{
			Name: m.Path, SPDXID: id, VersionInfo: m.Version, DownloadLocation: "https://proxy.golang.org/" + m.Path + "/@v/" + m.Version + ".zip",
			ExternalRefs: []externalRef{{"PACKAGE-MANAGER", "purl", goPurl(m.Path, m.Version, arch)}},
		}
		if m.Sum != "" {
			p.Comment = "go.sum " + m.Sum
		}
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, relationship{binID, "STATIC_LINK", id})
	}
	debs := append([]Deb(nil), img.Debs...)
	sort.Slice(debs, func(i, j int) bool { return debs[i].Name < debs[j].Name })
	for _, d := range debs {
		id := spdxID("Deb", d.Name+"-"+d.Arch)
		doc.Packages = append(doc.Packages, pkg{
			Name: d.Name, SPDXID: id, VersionInfo: d.Version, Supplier: "Organization: Debian", DownloadLocation: "NOASSERTION",
			ExternalRefs: []externalRef{{"PACKAGE-MANAGER", "purl", fmt.Sprintf("pkg:deb/debian/%s@%s?arch=%s&distro=debian-12", d.Name, url.PathEscape(d.Version), d.Arch)}},
			Comment:      "Debian source package " + d.Source,
		})
		doc.Relationships = append(doc.Relationships, relationship{imageID, "CONTAINS", id})
	}
	return json.MarshalIndent(doc, "", "  ")
}

// goPurl is the package URL of a Go module (purl-spec, type golang).
func goPurl(module, version, arch string) string {
	return fmt.Sprintf("pkg:golang/%s@%s?goarch=%s", module, url.PathEscape(version), arch)
}
