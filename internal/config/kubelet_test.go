package config

import (
	"testing"

	"github.com/nodelocaldns/nodelocaldns/internal/config/configmaptest"
)

// kubeletWrite updates a ConfigMap volume as the kubelet does.
func kubeletWrite(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	configmaptest.Write(t, dir, files)
}
