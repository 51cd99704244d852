package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The binary's flags and exit codes, in process. Tests that run the built
// binary (on a node, in a namespace, as the manifest and the docs run it)
// live in test/deploy.

func TestBadFlagsExitTwoWithOneLine(t *testing.T) {
	for _, args := range [][]string{
		{"-port", "seventy"},
		{"-localip", "1.2.3"},
		{"-kube-dns", "10.0.0.1", "-resolv-conf", "/nonexistent"},
		{"-resolv-conf", "/etc/hostname"},
	} {
		var stdout, stderr bytes.Buffer
		t.Setenv("KUBE_DNS_SERVICE_HOST", "")
		if code := run(args, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
		msg := stderr.String()
		if strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "nodelocaldns: ") || strings.Contains(msg, "<nil>") {
			t.Errorf("%v: stderr %q is not one clear line", args, msg)
		}
	}
}

func TestCheckConfigTouchesNothing(t *testing.T) {
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	_ = os.WriteFile(rc, []byte("nameserver 192.0.2.53\n"), 0o644)
	var stdout, stderr bytes.Buffer
	code := run([]string{"-check-config", "-kube-dns", "10.96.0.10", "-resolv-conf", rc}, &stdout, &stderr)
	if code != 0 || !strings.Contains(stdout.String(), "configuration is valid") || !strings.Contains(stdout.String(), "10.96.0.10:53") {
		t.Fatalf("exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}
