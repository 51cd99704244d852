package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// The node tests (issue 40) run after e2e_test.go's, whose last one
// deleted the DaemonSet: this file's deploys it again with
// -node-condition, shutdown_test.go's uses it and leaves it running.

// nodeJSON is the part of the node the tests read.
type nodeJSON struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Taints []struct {
			Key, Value, Effect string
		} `json:"taints"`
	} `json:"spec"`
	Status struct {
		Conditions []struct {
			Type, Status, Reason, Message string
			LastTransitionTime            time.Time `json:"lastTransitionTime"`
		} `json:"conditions"`
	} `json:"status"`
}

// theNode reads the cluster's one node.
func theNode(t *testing.T) nodeJSON {
	t.Helper()
	var list struct{ Items []nodeJSON }
	if err := json.Unmarshal([]byte(mustKubectl(t, "get", "nodes", "-o", "json")), &list); err != nil || len(list.Items) != 1 {
		t.Fatalf("nodes: %v (%d)", err, len(list.Items))
	}
	return list.Items[0]
}

// conditionOf is the node's condition typ ("" status when absent).
func (n nodeJSON) conditionOf(typ string) (status, reason string, since time.Time) {
	for _, c := range n.Status.Conditions {
		if c.Type == typ {
			return c.Status, c.Reason, c.LastTransitionTime
		}
	}
	return "", "", time.Time{}
}

// readinessRule is what of deploy/node-readiness/rule.yaml the stand-in
// controller follows.
type readinessRule struct {
	Spec struct {
		Conditions []struct {
			Type, RequiredStatus string
		} `json:"conditions"`
		Taint struct {
			Key, Value, Effect string
		} `json:"taint"`
		EnforcementMode string `json:"enforcementMode"`
	} `json:"spec"`
}

// ruleController plays the Node Readiness Controller's part for the rule
// (its module is not on the Go module proxy): bootstrap-only, it taints
// the node while the rule's condition is not True and lifts the taint,
// once and for good, when it is. It returns when the rule completed
// (the time the taint was lifted) or stop closes.
func ruleController(t *testing.T, r readinessRule, stop <-chan struct{}, lifted *atomic.Int64) {
	cond := r.Spec.Conditions[0]
	taint := r.Spec.Taint.Key + "=" + r.Spec.Taint.Value + ":" + r.Spec.Taint.Effect
	tainted := false
	for {
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		n, err := kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}")
		if err != nil {
			continue
		}
		out, err := kubectl("get", "node", n, "-o", "json")
		if err != nil {
			continue
		}
		var node nodeJSON
		if json.Unmarshal([]byte(out), &node) != nil {
			continue
		}
		status, _, _ := node.conditionOf(cond.Type)
		switch {
		case status != cond.RequiredStatus && !tainted:
			if out, err := kubectl("taint", "node", n, taint, "--overwrite"); err != nil {
				t.Logf("taint: %v: %s", err, out)
				continue
			}
			tainted = true
		case status == cond.RequiredStatus && tainted:
			if out, err := kubectl("taint", "node", n, r.Spec.Taint.Key+":"+r.Spec.Taint.Effect+"-"); err != nil {
				t.Logf("untaint: %v: %s", err, out)
				continue
			}
			lifted.Store(time.Now().UnixNano())
			return
		}
	}
}

// TestNodeReadinessHoldsPodsUntilDNSAnswers: with the Node Readiness
// Controller rule of deploy/node-readiness (played by ruleController) and
// no cache on the node, a pod created then is held off the node by the
// rule's taint; the DaemonSet with its -node-condition line uncommented
// and deploy/node-readiness/rbac.yaml applied starts (it tolerates the
// taint), sets the condition once it answers through every address, the
// taint goes, and the pod's very first lookups (its first command)
// succeed: an external name and a cluster name.
func TestNodeReadinessHoldsPodsUntilDNSAnswers(t *testing.T) {
	rb, err := os.ReadFile("deploy/node-readiness/rule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rule readinessRule
	if err := yaml.Unmarshal(rb, &rule); err != nil || len(rule.Spec.Conditions) != 1 || rule.Spec.EnforcementMode != "bootstrap-only" {
		t.Fatalf("rule.yaml: %v %+v", err, rule)
	}
	typ := rule.Spec.Conditions[0].Type
	// No cache on the node (the DaemonSet was deleted before, unless this
	// test runs alone).
	_, _ = kubectl("-n", "kube-system", "delete", "daemonset/nodelocaldns", "--ignore-not-found", "--wait=true", "--timeout=120s")
	poll(t, 90*time.Second, func() error {
		if p := nldPods(t); len(p) != 0 {
			return fmt.Errorf("pods left: %v", p)
		}
		return nil
	})
	if status, _, _ := theNode(t).conditionOf(typ); status == "True" {
		t.Fatalf("condition %s True with no cache on the node", typ)
	}
	mustKubectl(t, "apply", "-f", "deploy/node-readiness/rbac.yaml")

	stop := make(chan struct{})
	done := make(chan struct{})
	var lifted atomic.Int64
	go func() { defer close(done); ruleController(t, rule, stop, &lifted) }()
	defer func() {
		close(stop)
		<-done
		// A failure before the controller lifted the taint would leave it,
		// and the next tests' pods would never be scheduled.
		_, _ = kubectl("taint", "nodes", "--all", rule.Spec.Taint.Key+":"+rule.Spec.Taint.Effect+"-")
	}()
	poll(t, 30*time.Second, func() error {
		for _, x := range theNode(t).Spec.Taints {
			if x.Key == rule.Spec.Taint.Key {
				return nil
			}
		}
		return fmt.Errorf("the rule's taint is not on the node")
	})

	// The pod: its first command is the lookups.
	pod := `apiVersion: v1
kind: Pod
metadata: {name: held, namespace: default}
spec:
  dnsPolicy: ClusterFirst
  restartPolicy: Never
  terminationGracePeriodSeconds: 0
  containers:
    - name: c
      image: localhost/client:e2e
      imagePullPolicy: Never
      command: [sh, -c, 'date +%s.%N; getent ahostsv4 ` + externalName + ` && getent ahostsv4 hello.default.svc.cluster.local && echo LOOKUPS-OK']
`
	if out, err := kubectlIn(pod, "apply", "-f", "-"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	defer func() { _, _ = kubectl("delete", "pod", "held", "--wait=false") }()
	time.Sleep(3 * time.Second)
	if node := mustKubectl(t, "get", "pod", "held", "-o", "jsonpath={.spec.nodeName}"); node != "" {
		t.Fatalf("the pod was scheduled to %s while the node was tainted", node)
	}
	reason := mustKubectl(t, "get", "pod", "held", "-o", `jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}`)
	if !strings.Contains(reason, rule.Spec.Taint.Key) {
		t.Logf("scheduler: %s", reason)
	}

	// The cache, with its -node-condition line on.
	raw, err := os.ReadFile(os.Getenv("NLD_E2E_MANIFEST"))
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^( *)# (- -node-condition=` + regexp.QuoteMeta(typ) + `)$`)
	if !line.Match(raw) {
		t.Fatalf("the rendered manifest has no '# - -node-condition=%s' line", typ)
	}
	manifest := line.ReplaceAllString(string(raw), "$1$2")
	if out, err := kubectlIn(manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	mustKubectl(t, "-n", "kube-system", "rollout", "status", "ds/nodelocaldns", "--timeout=180s")
	poll(t, 60*time.Second, func() error {
		if lifted.Load() == 0 {
			status, reason, _ := theNode(t).conditionOf(typ)
			return fmt.Errorf("taint not lifted; condition %s=%s (%s)", typ, status, reason)
		}
		return nil
	})
	status, reason, since := theNode(t).conditionOf(typ)
	if status != "True" || reason != "Serving" {
		t.Fatalf("condition %s=%s (%s)", typ, status, reason)
	}
	poll(t, 60*time.Second, func() error {
		phase := mustKubectl(t, "get", "pod", "held", "-o", "jsonpath={.status.phase}")
		if phase == "Succeeded" || phase == "Failed" {
			return nil
		}
		return fmt.Errorf("pod phase %q", phase)
	})
	logs := mustKubectl(t, "logs", "held")
	if !strings.Contains(logs, "LOOKUPS-OK") || !strings.Contains(logs, externalIP) {
		t.Fatalf("the pod's first lookups failed:\n%s", logs)
	}
	started, _ := time.Parse(time.RFC3339, mustKubectl(t, "get", "pod", "held", "-o", "jsonpath={.status.startTime}"))
	t.Logf("condition True at %s, taint lifted %s, pod started %s; first lookups:\n%s",
		since.Format(time.TimeOnly), time.Unix(0, lifted.Load()).Format(time.TimeOnly), started.Format(time.TimeOnly), logs)
	if started.Before(since.Truncate(time.Second)) {
		t.Errorf("the pod started (%v) before the condition was True (%v)", started, since)
	}
}
