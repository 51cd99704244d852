package config

import (
	"errors"
	"io"
	"testing"
	"time"
)

func TestLifecycleFlags(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	env := envOf(map[string]string{"KUBE_DNS_SERVICE_HOST": "10.96.0.10"})
	c, err := Parse([]string{"-localip", "169.254.20.10", "-resolv-conf", rc}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.HealthAddr != "169.254.20.10:8080" || c.MetricsAddr != "169.254.20.10:9253" {
		t.Errorf("health %q metrics %q", c.HealthAddr, c.MetricsAddr)
	}
	if c.LameDuck != 5*time.Second || c.StateDir != "/run/nodelocaldns" || c.QueryLog {
		t.Errorf("lameduck %v state dir %q querylog %v", c.LameDuck, c.StateDir, c.QueryLog)
	}
	c, err = Parse([]string{"-localip", "127.0.0.1", "-resolv-conf", rc, "-local-mode", "-health-port", "0"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.StateDir != "" || c.HealthAddr != "" {
		t.Errorf("local mode: state dir %q; health port 0: health address %q", c.StateDir, c.HealthAddr)
	}
	c, err = Parse([]string{"-localip", "127.0.0.1", "-resolv-conf", rc, "-local-mode", "-state-dir", "/tmp/x", "-health-listen-address", "127.0.0.1:18080"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.StateDir != "/tmp/x" || c.HealthAddr != "127.0.0.1:18080" {
		t.Errorf("explicit: state dir %q health %q", c.StateDir, c.HealthAddr)
	}
	for _, args := range [][]string{
		{"-lameduck", "-1s"},
		{"-lameduck", "2m"},
		{"-state-dir", "relative/dir"},
		{"-health-listen-address", "nonsense"},
	} {
		if _, err := Parse(append([]string{"-resolv-conf", rc}, args...), env, io.Discard); !errors.Is(err, ErrUsage) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}
