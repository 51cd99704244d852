package dropin

import (
	"testing"

	"github.com/miekg/dns"
)

// moreCorpusCases are the configurations issue 29 listed as not yet in the
// corpus: KubeKey's, KubeOne's, an EKS IPv6 cluster's with a JSON log
// format, Gardener's with the coredns-custom ConfigMap of its docs.
func moreCorpusCases(t *testing.T) []corpusCase {
	return []corpusCase{
		{
			// KubeKey v4 renders the Corefile itself (mounted as
			// /etc/coredns/Corefile): kubespray's blocks without
			// prometheus, node-cache's own metrics on 127.0.0.1:9353; the
			// defaults (nodelocaldns.ip 169.254.25.10, no external zones,
			// no dns_etc_hosts), coredns.ip the stand-in. (KubeKey v3's
			// cmd/kk/pkg/plugins/dns/templates is kubespray's Corefile and
			// arguments word for word: the kubespray case.)
			name:   "kubekey",
			source: "kubesphere/kubekey@1c3204b1 builtin/core/roles/kubernetes/init-kubernetes/templates/dns/nodelocaldns.yaml, builtin/core/roles/defaults/defaults/main/05-dns.yaml",
			conf:   kubekeyCorefile,
			args:   []string{"-localip", "169.254.25.10", "-conf", "CONF", "-upstreamsvc", "coredns", "-metrics-listen-address", "127.0.0.1:9353", "-setupiptables=false"},
		},
		{
			// KubeOne's addon leaves node-cache's own placeholders in
			// Corefile.base (bind __PILLAR__LOCAL__DNS__
			// __PILLAR__DNS__SERVER__) and gives -localip the link-local
			// address alone: node-cache fills them in (the reference cases
			// run the docs' sed output instead).
			name:   "kubeone",
			source: "kubermatic/kubeone@911f2d6a addons/nodelocaldns/nodelocaldns.yaml (ServiceDomainName cluster.local, NodeLocalDNSVirtualIP 169.254.20.10)",
			base:   kubeoneCorefile,
			args:   []string{"-localip", "169.254.20.10", "-conf", "CONF", "-upstreamsvc", "kube-dns-upstream", "-setupiptables=false"},
		},
		{
			// An EKS IPv6 cluster (dual-stack nodes, IPv6 Services): the
			// reference blocks bound to ::ffaa and kube-dns' ::a of the
			// Service range, health on [::ffaa]:8080, and in "." a log line
			// in a JSON format and a template answering AAAA with NOERROR
			// (the cluster reaches the internet over IPv4 only). Run in the
			// IPv6-only pod namespace: both binaries create the addresses
			// and forward to kube-dns and the VPC resolver over IPv6.
			name:   "eks-ipv6-json-log",
			source: "linz/topo-workflows@a579a516 infra/charts/kube-system.node.local.dns.ts (generateCorefile, the DaemonSet args), infra/charts/kube-system.coredns.ts (CoreFileJsonLogFormat)",
			base:   eksIPv6Corefile,
			args:   []string{"-localip", local6 + "," + kubeDNS6Clust, "-conf", "CONF", "-upstreamsvc", "kube-dns-upstream", "-setupiptables=false"},
			ipv6:   true,
			extra:  []corpusQ{{"www.example.org.", dns.TypeAAAA}, {mustReverse(kubeDNS6Clust), dns.TypePTR}},
		},
		{
			// Gardener since v1.132 mounts the coredns-custom ConfigMap at
			// /etc/custom: *.override files are imported into the
			// cluster.local and "." blocks, *.server files go through the
			// coredns-config-adapter sidecar (port 8053 → 53, the node's
			// bind first, the block's own bind dropped) into
			// /etc/generated-config/custom-server-block.server. The
			// ConfigMap is the docs' example: debug and whoami in
			// corefile.override, a global:8053 block in istio.server,
			// forwarding to the stand-in instead of 1.2.3.4. whoami lands
			// beside forward . in both blocks: CoreDNS runs it after
			// forward, so it never answers (the same answers show it).
			name:   "gardener-coredns-custom",
			source: "gardener/gardener@b312835d pkg/component/networking/nodelocaldns/resources.go (CustomDNSServerInNodeLocalDNS), nodelocaldns.go; docs/usage/networking/custom-dns-config.md (the example); gardener/coredns-config-adapter main.go (buildServerConfig)",
			base:   gardenerCustomCorefile,
			etc: map[string]string{
				"custom/corefile.override":                    "# <some-plugin> <some-plugin-config>\ndebug\nwhoami\n",
				"custom/istio.server":                         "global:8053 {\n        errors\n        cache 30\n        forward . " + oracleNodeDNS + "\n    }\n",
				"generated-config/custom-server-block.server": "global:53 {\n    bind 169.254.20.10 10.96.0.10\n    errors\n    cache 30\n    forward . " + oracleNodeDNS + "\n}\n\n",
			},
			args:  []string{"-localip", "169.254.20.10,10.96.0.10", "-conf", "CONF", "-upstreamsvc", "kube-dns-upstream", "-health-port", "8099", "-setupiptables=false"},
			extra: []corpusQ{{"svc.global.", dns.TypeA}},
		},
	}
}

func mustReverse(ip string) string {
	r, err := dns.ReverseAddr(ip)
	if err != nil {
		panic(err)
	}
	return r
}

// kubekeyCorefile is KubeKey v4's template with its defaults.
var kubekeyCorefile = `cluster.local:53 {
  errors
  cache {
     success 9984 30
      denial 9984 5
  }
  reload
  loop
  bind 169.254.25.10
  forward . ` + oracleKubeDNS + ` {
    force_tcp
  }
  health 169.254.25.10:9254
}
in-addr.arpa:53 {
  errors
  cache 30
  reload
  loop
  bind 169.254.25.10
  forward . ` + oracleKubeDNS + ` {
    force_tcp
  }
}
ip6.arpa:53 {
  errors
  cache 30
  reload
  loop
  bind 169.254.25.10
  forward . ` + oracleKubeDNS + ` {
      force_tcp
  }
}
.:53 {
  errors
  cache 30
  reload
  loop
  bind 169.254.25.10
  forward . /etc/resolv.conf
}
`

// kubeoneCorefile is KubeOne's ConfigMap, node-cache's placeholders kept.
var kubeoneCorefile = `cluster.local:53 {
    errors
    cache {
            success 9984 30
            denial 9984 5
    }
    reload
    loop
    bind __PILLAR__LOCAL__DNS__ __PILLAR__DNS__SERVER__
    forward . __PILLAR__CLUSTER__DNS__ {
            force_tcp
    }
    prometheus :9253
    health __PILLAR__LOCAL__DNS__:8080
    }
in-addr.arpa:53 {
    errors
    cache 30
    reload
    loop
    bind __PILLAR__LOCAL__DNS__ __PILLAR__DNS__SERVER__
    forward . __PILLAR__CLUSTER__DNS__ {
            force_tcp
    }
    prometheus :9253
    }
ip6.arpa:53 {
    errors
    cache 30
    reload
    loop
    bind __PILLAR__LOCAL__DNS__ __PILLAR__DNS__SERVER__
    forward . __PILLAR__CLUSTER__DNS__ {
            force_tcp
    }
    prometheus :9253
    }
.:53 {
    errors
    cache 30
    reload
    loop
    bind __PILLAR__LOCAL__DNS__ __PILLAR__DNS__SERVER__
    forward . __PILLAR__UPSTREAM__SERVERS__
    prometheus :9253
    }
`

// eksJSONLogFormat is linz/topo-workflows' CoreFileJsonLogFormat, one
// Corefile token (no blanks; the quotes are inside it).
const eksJSONLogFormat = `{"remoteIp":"{remote}","remotePort":{port},"protocol":"{proto}","queryId":"{>id}","queryType":"{type}","queryClass":"{class}","queryName":"{name}","querySize":{size},"dnsSecOk":"{>do}","responseCode":"{rcode}","responseFlags":"{>rflags}","responseSize":{rsize}}`

// eksIPv6Corefile is generateCorefile's output for the Service range
// fd00:10:96::/108 (bindAddress ::ffaa, upstreamAddress ::a).
var eksIPv6Corefile = `cluster.local:53 {
      errors
      cache {
              success 9984 30
              denial 9984 5
      }
      reload
      loop
      bind ` + local6 + ` ` + kubeDNS6Clust + `
      forward . __PILLAR__CLUSTER__DNS__ {
              force_tcp
      }
      prometheus :9253
      health [` + local6 + `]:8080
  }
    
  in-addr.arpa:53 {
      errors
      cache 30
      reload
      loop
      bind ` + local6 + ` ` + kubeDNS6Clust + `
      forward . __PILLAR__CLUSTER__DNS__ {
              force_tcp
      }
      prometheus :9253
  }
      
  ip6.arpa:53 {
      errors
      cache 30
      reload
      loop
      bind ` + local6 + ` ` + kubeDNS6Clust + `
      forward . __PILLAR__CLUSTER__DNS__ {
              force_tcp
      }
      prometheus :9253
  }
    
  .:53 {
      log . ` + eksJSONLogFormat + `
      errors
      cache 30
      reload
      loop
      template ANY AAAA { 
        rcode NOERROR
      }
      bind ` + local6 + ` ` + kubeDNS6Clust + `
      forward . __PILLAR__UPSTREAM__SERVERS__
      prometheus :9253
  }`

// gardenerCustomCorefile is Gardener's Corefile today: iptables mode (bind
// the link-local address and the kube-dns ClusterIP), force_tcp both ways,
// the overrides imported, and the adapter's file when the ConfigMap has a
// *.server key.
var gardenerCustomCorefile = `cluster.local:53 {
    loop
    bind 169.254.20.10 10.96.0.10
    forward . __PILLAR__CLUSTER__DNS__ {
            force_tcp
    }
    prometheus :9253
    health 169.254.20.10:8099
    import custom/*.override
    errors
    cache {
            success 9984 30
            denial 9984 5
    }
    reload
    }
in-addr.arpa:53 {
    errors
    cache 30
    reload
    loop
    bind 169.254.20.10 10.96.0.10
    forward . __PILLAR__CLUSTER__DNS__ {
            force_tcp
    }
    prometheus :9253
    }
ip6.arpa:53 {
    errors
    cache 30
    reload
    loop
    bind 169.254.20.10 10.96.0.10
    forward . __PILLAR__CLUSTER__DNS__ {
            force_tcp
    }
    prometheus :9253
    }
.:53 {
    loop
    bind 169.254.20.10 10.96.0.10
    forward . __PILLAR__UPSTREAM__SERVERS__ {
            force_tcp
    }
    prometheus :9253
    import custom/*.override
    errors
    cache 30
    reload
    }
import generated-config/custom-server-block.server
`
