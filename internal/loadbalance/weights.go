package loadbalance

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// MaxWeightFile bounds a weight file: a larger one is refused at start
// and, at a reload, leaves the weights as they were. A node cache weighs
// the addresses of a few names; a megabyte is tens of thousands of lines.
const MaxWeightFile = 1 << 20

// DefaultWeightReload is how often the weight file is checked for a
// change, as CoreDNS's default `reload 30s`.
const DefaultWeightReload = 30 * time.Second

// Weights is the weighted policy's weight file, in CoreDNS's format: a
// name on a line of its own, then its addresses, each with a weight
// 1-255; empty lines and lines starting with # are skipped. An owner name
// matches its entry exactly (as written, with a final dot added), as in
// CoreDNS.
//
// With Reload above zero the file is read again when an answer is
// weighted Reload after the last read (instead of CoreDNS's timer); a
// change takes effect, a file that does not open or parse is logged and
// the weights stay as they were.
type Weights struct {
	File   string
	Reload time.Duration // 0: never read again

	cur     atomic.Pointer[weightTable]
	sum     [sha256.Size]byte // the content cur was read from; guarded by loading
	next    atomic.Int64      // unix ns of the next check; 0: not timed yet
	loading atomic.Bool
	mu      sync.Mutex // orders reads of the file
}

// weightTable is one reading of the weight file.
type weightTable struct {
	names map[string][]weightItem
}

type weightItem struct {
	addr  net.IP
	value uint8
}

// ErrWeightFileOpen: the weight file does not open.
var ErrWeightFileOpen = errors.New("weight file open error")

// NewWeights reads file. A file that does not parse is an error; one
// that does not open is an error when reload is 0, else it is returned
// with the error wrapped in ErrWeightFileOpen and no weights, and read
// again every reload (CoreDNS warns and retries the same way).
func NewWeights(file string, reload time.Duration) (*Weights, error) {
	w := &Weights{File: file, Reload: reload}
	w.cur.Store(&weightTable{})
	err := w.read()
	if errors.Is(err, ErrWeightFileOpen) && reload > 0 {
		return w, err
	}
	if err != nil {
		return nil, err
	}
	return w, nil
}

// table is the current weights, first starting a read of the file in the
// background when Reload has passed since the last.
func (w *Weights) table() *weightTable {
	if w.Reload > 0 {
		now := time.Now().UnixNano()
		n := w.next.Load()
		if n == 0 {
			w.next.CompareAndSwap(0, now+int64(w.Reload))
		} else if now >= n && w.loading.CompareAndSwap(false, true) {
			w.next.Store(now + int64(w.Reload))
			go func() {
				defer w.loading.Store(false)
				if err := w.read(); err != nil {
					slog.Default().Warn("loadbalance: the weight file was not reloaded; the weights stay as they were", "file", w.File, "err", err)
				}
			}()
		}
	}
	return w.cur.Load()
}

// read reads the file and, when its content changed and parses, makes it
// the current weights.
func (w *Weights) read() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	f, err := os.Open(w.File)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrWeightFileOpen, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxWeightFile+1))
	if err != nil {
		return fmt.Errorf("weight file %s: %v", w.File, err)
	}
	if len(b) > MaxWeightFile {
		return fmt.Errorf("weight file %s is larger than %d bytes", w.File, MaxWeightFile)
	}
	sum := sha256.Sum256(b)
	if sum == w.sum {
		return nil
	}
	t, err := parseWeights(b, w.File)
	if err != nil {
		return err
	}
	w.sum = sum
	w.cur.Store(t)
	return nil
}

// parseWeights reads a weight file's content as CoreDNS's parseWeights.
func parseWeights(b []byte, file string) (*weightTable, error) {
	t := &weightTable{names: map[string][]weightItem{}}
	var name string
	s := bufio.NewScanner(bytes.NewReader(b))
	s.Buffer(make([]byte, 0, 4096), MaxWeightFile)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		switch len(f) {
		case 1:
			if net.ParseIP(f[0]) != nil {
				return nil, fmt.Errorf("wrong domain name:%q in weight file %s. (Maybe a missing weight value?)", f[0], file)
			}
			if _, ok := dns.IsDomainName(f[0]); !ok {
				return nil, fmt.Errorf("wrong domain name:%q in weight file %s", f[0], file)
			}
			name = dns.Fqdn(f[0])
			if _, ok := t.names[name]; !ok {
				t.names[name] = nil
			}
		case 2:
			ip := net.ParseIP(f[0])
			if ip == nil {
				return nil, fmt.Errorf("wrong IP address:%q in weight file %s", f[0], file)
			}
			v, err := strconv.ParseUint(f[1], 10, 8)
			if err != nil || v == 0 {
				return nil, fmt.Errorf("wrong weight value:%q in weight file %s", f[1], file)
			}
			if name == "" {
				return nil, fmt.Errorf("missing domain name in weight file %s", file)
			}
			t.names[name] = append(t.names[name], weightItem{addr: ip, value: uint8(v)})
		default:
			return nil, fmt.Errorf("could not parse weight line:%q in weight file %s", line, file)
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("weight file %s parsing error:%s", file, err)
	}
	return t, nil
}

// weight is r's weight: its address's entry under its owner name, else 1.
func (t *weightTable) weight(r dns.RR) uint8 {
	ip := addressOf(r)
	for _, it := range t.names[r.Header().Name] {
		if it.addr.Equal(ip) {
			return it.value
		}
	}
	return 1
}

// Names is how many names the current weights list.
func (w *Weights) Names() int { return len(w.cur.Load().names) }
