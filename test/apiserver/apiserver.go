// Package apiserver starts a real etcd and a real kube-apiserver on free
// loopback ports for tests that talk to the Kubernetes API (never a fake
// clientset). kube-apiserver is built from the Go module proxy and cached
// by test/kube/build.sh; etcd comes from Debian's etcd-server package
// (.ci/run installs it). When either is missing the test is skipped with
// the reason, except in CI (CI=true), where it fails.
//
// No controller-manager runs: namespaces get their default ServiceAccount
// from CreateNamespace, pods stay as they are written, and their IPs are
// set through the status subresource (SetPodIP).
package apiserver

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// startTimeout bounds one start of kube-apiserver until /readyz is ok:
// about 5 s on an idle machine, several times that under `go test ./...`
// on 2 cores.
const startTimeout = 90 * time.Second

// Server is a running etcd + kube-apiserver pair.
type Server struct {
	// URL is the API server's https address.
	URL string
	// AdminToken authenticates as a member of system:masters.
	AdminToken string
	// Dir holds certificates, keys, data and logs.
	Dir string

	t       testing.TB
	bin     string
	args    []string
	mu      sync.Mutex
	api     *exec.Cmd
	apiDone chan struct{}
	client  *http.Client
}

// Skip skips t with reason, or fails it in CI.
func Skip(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %s", reason)
	}
	t.Skip(reason)
}

// Option changes how Start starts kube-apiserver.
type Option func(*[]string)

// NodeAuthorization runs kube-apiserver as clusters do for their
// kubelets: --authorization-mode=Node,RBAC and the NodeRestriction
// admission plugin (a node writes its own Node and nothing of another's).
func NodeAuthorization() Option {
	return func(args *[]string) {
		for i, a := range *args {
			if a == "--authorization-mode=RBAC" {
				(*args)[i] = "--authorization-mode=Node,RBAC"
			}
		}
		*args = append(*args, "--enable-admission-plugins=NodeRestriction")
	}
}

// Start starts etcd and kube-apiserver for t; both stop when t ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		Skip(t, "etcd not found: apt-get install etcd-server (.ci/run does)")
	}
	apiBin, err := buildAPIServer()
	if err != nil {
		Skip(t, "kube-apiserver unavailable: "+err.Error())
	}
	dir := t.TempDir()
	s := &Server{t: t, Dir: dir, bin: apiBin, AdminToken: randomToken()}

	etcdPort, peerPort := testhost.FreePort(t, "127.0.0.1"), testhost.FreePort(t, "127.0.0.1")
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	etcd := exec.Command(etcdBin, "--name", "test", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "test="+peerURL, "--log-level", "warn")
	etcdLog := logFile(t, dir, "etcd.log")
	etcd.Stdout, etcd.Stderr = etcdLog, etcdLog
	if err := etcd.Start(); err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	etcdDone := make(chan struct{})
	go func() { _ = etcd.Wait(); close(etcdDone) }()
	t.Cleanup(func() {
		_ = etcd.Process.Kill()
		<-etcdDone
	})

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keyFile, pubFile := filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	writeFile(t, pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	tokens := filepath.Join(dir, "tokens.csv")
	writeFile(t, tokens, []byte(s.AdminToken+",admin,admin,system:masters\n"))

	port := testhost.FreePort(t, "127.0.0.1")
	s.URL = "https://127.0.0.1:" + strconv.Itoa(port)
	s.args = []string{
		"--etcd-servers=" + etcdURL, "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port), "--cert-dir=" + filepath.Join(dir, "certs"),
		"--token-auth-file=" + tokens, "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + pubFile, "--service-account-signing-key-file=" + keyFile,
		"--service-cluster-ip-range=10.96.0.0/16",
		// v1.37 refuses a loopback advertise address for the kubernetes
		// Service's endpoints; no client here uses that Service.
		"--endpoint-reconciler-type=none",
	}
	for _, o := range opts {
		o(&s.args)
	}
	s.client = &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // test server's self-signed cert
	}
	t.Cleanup(s.Stop)
	s.Restart()
	return s
}

// Stop stops kube-apiserver (etcd keeps running); Restart starts it again
// on the same address.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.api == nil {
		return
	}
	_ = s.api.Process.Signal(os.Interrupt)
	select {
	case <-s.apiDone:
	case <-time.After(20 * time.Second):
		_ = s.api.Process.Kill()
		<-s.apiDone
	}
	s.api = nil
}

// Restart starts kube-apiserver (after Stop) and waits until it is ready.
// The port is one the kernel picked (in the ephemeral range), so while the
// server was down another socket may have taken it as its local port (a
// client's, or a connection to the port itself: TCP self-connect); the
// start is then tried again until the port is free.
func (s *Server) Restart() {
	s.t.Helper()
	for try := 1; ; try++ {
		if s.restart(try == maxStartTries) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// maxStartTries bounds the starts Restart makes while the port is taken:
// 10 s of retries, far longer than any connection holds a port here.
const maxStartTries = 50

// restart starts kube-apiserver once and waits until it is ready. It
// reports false when it exited because its port was taken, unless last.
func (s *Server) restart(last bool) bool {
	t := s.t
	t.Helper()
	s.mu.Lock()
	if s.api != nil {
		s.mu.Unlock()
		return true
	}
	cmd := exec.Command(s.bin, s.args...)
	log := logFile(t, s.Dir, "kube-apiserver.log")
	cmd.Stdout, cmd.Stderr = log, log
	var from int64 // where this start's lines begin in the log
	if st, err := log.Stat(); err == nil {
		from = st.Size()
	}
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		t.Fatalf("start kube-apiserver: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.api, s.apiDone = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		if code, _, err := s.do(http.MethodGet, "/readyz", s.AdminToken, nil); err == nil && code == http.StatusOK {
			return true
		}
		select {
		case <-done:
			log := tail(filepath.Join(s.Dir, "kube-apiserver.log"))
			if !last && s.logSince(from, "address already in use") {
				s.mu.Lock()
				s.api = nil
				s.mu.Unlock()
				return false
			}
			t.Fatalf("kube-apiserver exited at start:\n%s", log)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready within %v:\n%s", startTimeout, tail(filepath.Join(s.Dir, "kube-apiserver.log")))
		}
	}
}

// Config is a client config for token (AdminToken, or one from
// ServiceAccountToken), as an in-cluster config would be.
func (s *Server) Config(token string) *rest.Config {
	return &rest.Config{Host: s.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
}

// Kubeconfig writes a kubeconfig for token and returns its path.
func (s *Server) Kubeconfig(token string) string {
	p := filepath.Join(s.Dir, "kubeconfig-"+strconv.Itoa(int(time.Now().UnixNano())))
	writeFile(s.t, p, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: test
  user: {token: %q}
contexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
`, s.URL, token)))
	return p
}

// Do sends body (JSON-encoded unless it is []byte) as admin and decodes the
// answer into out (when not nil). A status outside 2xx is an error.
func (s *Server) Do(method, path string, body, out any) error {
	return s.DoAs(s.AdminToken, method, path, body, out)
}

// DoAs is Do with another token.
func (s *Server) DoAs(token, method, path string, body, out any) error {
	code, data, err := s.do(method, path, token, body)
	if err != nil {
		return err
	}
	if code/100 != 2 {
		return &StatusError{Code: code, Body: string(data)}
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// StatusError is an answer outside 2xx.
type StatusError struct {
	Code int
	Body string
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Code, e.Body) }

// MustDo is Do failing the test on error.
func (s *Server) MustDo(method, path string, body, out any) {
	s.t.Helper()
	if err := s.Do(method, path, body, out); err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
}

func (s *Server) do(method, path, token string, body any) (int, []byte, error) {
	var r io.Reader
	ct := "application/json"
	switch b := body.(type) {
	case nil:
	case []byte:
		r = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return 0, nil, err
		}
		r = bytes.NewReader(data)
	}
	if method == http.MethodPatch {
		ct = "application/merge-patch+json"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", ct)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// CreateNamespace creates a namespace and its default ServiceAccount (no
// controller-manager creates it, and pods need it).
func (s *Server) CreateNamespace(name string) {
	s.t.Helper()
	s.MustDo(http.MethodPost, "/api/v1/namespaces", map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name},
	}, nil)
	s.MustDo(http.MethodPost, "/api/v1/namespaces/"+name+"/serviceaccounts", map[string]any{
		"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "default"},
	}, nil)
}

// ServiceAccountToken returns a token of the ServiceAccount namespace/name
// (TokenRequest API), valid for an hour: what the kubelet would mount.
func (s *Server) ServiceAccountToken(namespace, name string) string {
	s.t.Helper()
	var out struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	s.MustDo(http.MethodPost, "/api/v1/namespaces/"+namespace+"/serviceaccounts/"+name+"/token", map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
		"spec": map[string]any{"expirationSeconds": 3600},
	}, &out)
	return out.Status.Token
}

// PodToken returns a token of the ServiceAccount namespace/name bound to
// the pod namespace/pod (TokenRequest with a boundObjectRef), as the
// kubelet mounts it: it names the pod's node (the pod must be bound to
// one), which the API server's constrained impersonation checks.
func (s *Server) PodToken(namespace, name, pod string) string {
	s.t.Helper()
	var p struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	s.MustDo(http.MethodGet, "/api/v1/namespaces/"+namespace+"/pods/"+pod, nil, &p)
	var out struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	s.MustDo(http.MethodPost, "/api/v1/namespaces/"+namespace+"/serviceaccounts/"+name+"/token", map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
		"spec": map[string]any{"expirationSeconds": 3600,
			"boundObjectRef": map[string]any{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": p.Metadata.UID}},
	}, &out)
	return out.Status.Token
}

// SetPodIP gives a pod its addresses and phase Running through the status
// subresource, as the kubelet would.
func (s *Server) SetPodIP(namespace, name string, ips ...string) {
	s.t.Helper()
	var list []map[string]string
	for _, ip := range ips {
		list = append(list, map[string]string{"ip": ip})
	}
	s.MustDo(http.MethodPatch, "/api/v1/namespaces/"+namespace+"/pods/"+name+"/status", map[string]any{
		"status": map[string]any{"podIP": ips[0], "podIPs": list, "phase": "Running"},
	}, nil)
}

var build struct {
	once sync.Once
	bin  string
	err  error
}

// kubeVersion is the version test/kube/build.sh builds by default.
const kubeVersion = "v1.37.2"

// buildAPIServer finds the cached kube-apiserver, or runs
// test/kube/build.sh once per test binary. The cache is looked at first:
// the script takes a lock that another build (the e2e's, of every
// component) may hold for many minutes.
func buildAPIServer() (string, error) {
	build.once.Do(func() {
		cache := os.Getenv("NLD_CACHE")
		if cache == "" {
			cache = "/var/cache/nodelocaldns-test"
		}
		if p := filepath.Join(cache, "kube-"+kubeVersion, "kube-apiserver"); isExecutable(p) {
			build.bin = p
			return
		}
		root, err := repoRoot()
		if err != nil {
			build.err = err
			return
		}
		cmd := exec.Command(filepath.Join(root, "test/kube/build.sh"), "kube-apiserver")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			build.err = fmt.Errorf("test/kube/build.sh kube-apiserver: %v: %s", err, lastLines(stderr.String(), 5))
			return
		}
		build.bin = filepath.Join(strings.TrimSpace(string(out)), "kube-apiserver")
	})
	return build.bin, build.err
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "test/kube/build.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("test/kube/build.sh not found above the working directory")
		}
		dir = parent
	}
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

func writeFile(t testing.TB, p string, data []byte) {
	t.Helper()
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func logFile(t testing.TB, dir, name string) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// logSince reports whether kube-apiserver's log holds what past offset from.
func (s *Server) logSince(from int64, what string) bool {
	data, _ := os.ReadFile(filepath.Join(s.Dir, "kube-apiserver.log"))
	return int64(len(data)) > from && strings.Contains(string(data[from:]), what)
}

func tail(p string) string {
	data, _ := os.ReadFile(p)
	return lastLines(string(data), 20)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// manifestPaths is where ApplyManifest creates each kind it knows.
var manifestPaths = map[string]string{
	"ServiceAccount":     "/api/v1/namespaces/%s/serviceaccounts",
	"Role":               "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/roles",
	"RoleBinding":        "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/rolebindings",
	"ClusterRole":        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
	"ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}

// ApplyManifest creates the objects of the YAML file path whose kind is one
// of kinds (an object that exists already is left as it is), in their
// namespace (kube-system when they name none), and fails t unless each
// kind was found: a test runs with exactly the rights a manifest gives.
func (s *Server) ApplyManifest(t testing.TB, path string, kinds ...string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			Kind     string
			Metadata struct{ Namespace string }
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		p, ok := manifestPaths[meta.Kind]
		if !ok || !slices.Contains(kinds, meta.Kind) {
			continue
		}
		if strings.Contains(p, "%s") {
			ns := cmp.Or(meta.Metadata.Namespace, "kube-system")
			p = fmt.Sprintf(p, ns)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatal(err)
		}
		var se *StatusError
		if err := s.Do(http.MethodPost, p, js, nil); err != nil && !(errors.As(err, &se) && se.Code == http.StatusConflict) {
			t.Fatalf("create %s: %v", meta.Kind, err)
		}
		found[meta.Kind] = true
	}
	for _, k := range kinds {
		if !found[k] {
			t.Fatalf("%s has no %s (or it is not a kind ApplyManifest creates)", path, k)
		}
	}
}
