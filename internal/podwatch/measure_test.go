package podwatch

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"

	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
)

// TestMeasureWatchMemory reports the heap the watch holds for a node's
// pods (NLD_MEASURE=1 go test -run MeasureWatchMemory -v ./internal/podwatch).
func TestMeasureWatchMemory(t *testing.T) {
	if os.Getenv("NLD_MEASURE") == "" {
		t.Skip("a measurement: NLD_MEASURE=1")
	}
	const pods = 110 // the kubelet's default maxPods
	s := apiserver.Start(t)
	s.CreateNamespace("shop")
	for i := 0; i < pods; i++ {
		for _, node := range []string{"node1", "node2"} {
			name := fmt.Sprintf("p%d-%s", i, node)
			createPod(t, s, "shop", name, node, map[string]any{
				"dnsConfig": map[string]any{"searches": []any{"extra.example"}},
			})
			s.SetPodIP("shop", name, fmt.Sprintf("10.%d.%d.%d", map[string]int{"node1": 1, "node2": 2}[node], i/250, i%250+1))
		}
	}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	w, err := New(Config{Rest: s.Config(s.AdminToken), NodeName: "node1", ClusterDomain: "cluster.local",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, 60*time.Second, "all pods", func() bool { return w.State() == kubewatch.Synced && w.Pods() == pods })
	after := heap()
	t.Logf("watch of %d pods (of %d in the cluster): heap +%d KiB (%d bytes per pod, informer store, view and client included)",
		pods, 2*pods, (after-before)/1024, (after-before)/pods)
}
