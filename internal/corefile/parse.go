package corefile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Block is one server block as written: its keys and its directives.
type Block struct {
	Pos        Pos
	Keys       []Token
	Directives []*Directive
}

// Directive is one line of a block: its name, its arguments and, when the
// line opens a '{', the lines inside (each a Directive with the option's
// name). CoreDNS plugins read their options the same way.
type Directive struct {
	Name  string
	Pos   Pos
	Args  []Token
	Block []*Directive // nil without '{'
	// HasBlock is true when the line opened a block, even an empty one.
	HasBlock bool
}

// Text renders the line and its block, one option per line, without
// positions.
func (d *Directive) Text() string {
	var b strings.Builder
	d.appendText(&b, "")
	return b.String()
}

func (d *Directive) appendText(b *strings.Builder, indent string) {
	b.WriteString(indent)
	b.WriteString(strconv.Quote(d.Name))
	for _, a := range d.Args {
		b.WriteByte(' ')
		b.WriteString(strconv.Quote(a.Text))
	}
	if d.HasBlock {
		b.WriteString(" {\n")
		for _, o := range d.Block {
			o.appendText(b, indent+"  ")
		}
		b.WriteString(indent + "}")
	}
	b.WriteByte('\n')
}

// ArgStrings returns the arguments' texts.
func (d *Directive) ArgStrings() []string {
	out := make([]string, len(d.Args))
	for i, a := range d.Args {
		out[i] = a.Text
	}
	return out
}

// Error is a Corefile error at a position.
type Error struct {
	Pos Pos
	Msg string
}

func (e *Error) Error() string { return e.Pos.String() + ": " + e.Msg }

func errAt(p Pos, format string, a ...any) error {
	return &Error{Pos: p, Msg: fmt.Sprintf(format, a...)}
}

// Limits that stop a cyclic, explosive or hostile Corefile (a ConfigMap
// anyone with edit rights writes, read again at every change) from running
// forever or filling memory; each far above what any real Corefile uses,
// and each error names the file and line where it was passed.
const (
	maxImports = 1000    // file and snippet expansions in one parse
	maxTokens  = 1 << 20 // tokens after expansion
	// maxDepth bounds the nesting of '{' (the parser recurses once per
	// level). CoreDNS's directives nest two levels, a server block and a
	// directive's options; 16 is eight times that. Unbounded, a 1.5 MiB
	// Corefile of nested blocks took the daemon from 22 to 325 MiB of
	// resident memory on reload, and kept it.
	maxDepth = 16
	// maxTotalSize bounds the text read in one parse, the Corefile and
	// every file it imports together. A ConfigMap, the Corefile's usual
	// source, holds at most 1 MiB; 8 MiB leaves room for files imported
	// from the host, and a glob of many large files fails here before it
	// is read whole.
	maxTotalSize = 8 << 20
)

// Env looks up an environment variable for {$NAME} and {%NAME%}.
type Env func(string) string

// maxFileSize bounds a Corefile or an imported file: a ConfigMap holds at
// most 1 MiB; four leaves room for a hand-written file.
const maxFileSize = 4 << 20

// ParseFile reads and parses the Corefile at path.
func ParseFile(path string, env Env) ([]*Block, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data, env)
}

// ReadFile reads a Corefile (or its template) as Parse bounds it: a
// regular file of at most 4 MiB.
func ReadFile(path string) ([]byte, error) { return readFile(path) }

// readFile reads a regular file of at most maxFileSize bytes (an import of
// /dev/zero or a FIFO must not hang the start).
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > maxFileSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxFileSize)
	}
	return io.ReadAll(io.LimitReader(f, maxFileSize+1))
}

// Parse parses Corefile text; file names it in errors and is the directory
// relative imports are resolved against.
func Parse(file string, data []byte, env Env) ([]*Block, error) {
	if env == nil {
		env = func(string) string { return "" }
	}
	if len(data) > maxFileSize {
		return nil, errAt(Pos{File: file, Line: 1}, "the Corefile is larger than %d bytes", maxFileSize)
	}
	toks, err := lex(file, data)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks, env: env, snippets: map[string][]Token{}, read: len(data)}
	return p.all()
}

type parser struct {
	toks     []Token
	i        int // next token
	env      Env
	snippets map[string][]Token
	imports  int
	depth    int // '{' open around p.i (maxDepth)
	read     int // bytes of text read (maxTotalSize)
}

func (p *parser) eof() bool { return p.i >= len(p.toks) }

// newLine reports whether token i starts a new line (or another file).
func (p *parser) newLine(i int) bool {
	if i == 0 {
		return true
	}
	a, b := p.toks[i-1], p.toks[i]
	return a.Pos.File != b.Pos.File || a.endLine < b.Pos.Line
}

func (p *parser) all() ([]*Block, error) {
	var out []*Block
	for !p.eof() {
		if err := p.expandImport(); err != nil {
			return nil, err
		}
		if p.eof() {
			break
		}
		b, err := p.block()
		if err != nil {
			return nil, err
		}
		if b != nil {
			out = append(out, b)
		}
	}
	return out, nil
}

// expandImport replaces an `import X` starting a line at p.i by what it
// names: a snippet, or the tokens of the files matching a glob. It repeats
// while the spliced tokens start with another import.
func (p *parser) expandImport() error {
	for !p.eof() && p.toks[p.i].Text == "import" && p.newLine(p.i) {
		t := p.toks[p.i]
		if p.i+1 >= len(p.toks) || p.newLine(p.i+1) {
			return errAt(t.Pos, "import: a file, glob or snippet name is required")
		}
		if p.i+2 < len(p.toks) && !p.newLine(p.i+2) && p.toks[p.i+2].Text != "}" {
			return errAt(t.Pos, "import takes one argument")
		}
		p.imports++
		if p.imports > maxImports {
			return errAt(t.Pos, "import: more than %d imports (a cycle?)", maxImports)
		}
		name := p.subst(p.toks[p.i+1].Text)
		var repl []Token
		if s, ok := p.snippets[name]; ok {
			repl = s
		} else {
			var err error
			if repl, err = p.importFiles(t.Pos, name); err != nil {
				return err
			}
		}
		if len(p.toks)+len(repl) > maxTokens {
			return errAt(t.Pos, "import: more than %d tokens", maxTokens)
		}
		rest := p.toks[p.i+2:]
		n := make([]Token, 0, p.i+len(repl)+len(rest))
		n = append(n, p.toks[:p.i]...)
		n = append(n, repl...)
		n = append(n, rest...)
		p.toks = n
	}
	return nil
}

// importFiles lexes the files matching pattern, relative to the directory
// of the file the import is in. Like CoreDNS: at most one wildcard; a glob
// matching nothing imports nothing; a plain path must exist.
func (p *parser) importFiles(at Pos, pattern string) ([]Token, error) {
	if pattern == "" {
		return nil, errAt(at, "import: empty path")
	}
	if !filepath.IsAbs(pattern) {
		pattern = filepath.Join(filepath.Dir(at.File), pattern)
	}
	if strings.Count(pattern, "*") > 1 || strings.Count(pattern, "?") > 1 || (strings.Contains(pattern, "[") && strings.Contains(pattern, "]")) {
		return nil, errAt(at, "import: a glob may hold one wildcard (*), got %s", pattern)
	}
	matches, err := filepath.Glob(pattern)
	if err != nil {
		return nil, errAt(at, "import %s: %v", pattern, err)
	}
	if len(matches) == 0 && !strings.ContainsAny(pattern, "*?") {
		return nil, errAt(at, "import: %s not found", pattern)
	}
	var out []Token
	for _, m := range matches {
		if st, err := os.Stat(m); err == nil && p.read+int(st.Size()) > maxTotalSize {
			return nil, errAt(at, "import %s: the Corefile and its imports are larger than %d bytes", m, maxTotalSize)
		}
		data, err := readFile(m)
		if err != nil {
			return nil, errAt(at, "import %s: %v", m, err)
		}
		if p.read += len(data); p.read > maxTotalSize {
			return nil, errAt(at, "import %s: the Corefile and its imports are larger than %d bytes", m, maxTotalSize)
		}
		toks, err := lex(m, data)
		if err != nil {
			return nil, err
		}
		out = append(out, toks...)
	}
	return out, nil
}

// subst replaces {$NAME} and {%NAME%} as CoreDNS does.
func (p *parser) subst(s string) string {
	s = replaceRefs(s, "{%", "%}", p.env)
	return replaceRefs(s, "{$", "}", p.env)
}

func replaceRefs(s, open, close string, env Env) string {
	for n := 0; n < 64; n++ { // bounded: a value may hold another reference
		i := strings.Index(s, open)
		if i < 0 {
			return s
		}
		j := strings.Index(s[i:], close)
		if j < 0 || j <= len(open) {
			return s
		}
		ref := s[i : i+j+len(close)]
		s = strings.ReplaceAll(s, ref, env(ref[len(open):len(ref)-len(close)]))
	}
	return s
}

// block reads one server block (or snippet definition, which returns nil).
func (p *parser) block() (*Block, error) {
	b := &Block{Pos: p.toks[p.i].Pos}
	if t := p.toks[p.i].Text; t == "}" || t == "{" {
		return nil, errAt(b.Pos, "unexpected '%s' where a server block's key belongs", t)
	}
	// Keys: the tokens of the first line, plus following lines while a key
	// ends with ','.
	more := false
	for {
		if p.eof() {
			if more {
				return nil, errAt(b.Pos, "expected another key after ','")
			}
			break
		}
		t := p.toks[p.i]
		t.Text = p.subst(t.Text)
		if t.Text == "{" {
			if more {
				return nil, errAt(t.Pos, "expected another key after ',', got '{'")
			}
			break
		}
		if len(b.Keys) > 0 && !more && p.newLine(p.i) {
			break
		}
		p.i++
		more = false
		if strings.HasSuffix(t.Text, ",") {
			t.Text = strings.TrimSuffix(t.Text, ",")
			more = true
		}
		if t.Text != "" {
			b.Keys = append(b.Keys, t)
		}
	}
	if len(b.Keys) == 1 && strings.HasPrefix(b.Keys[0].Text, "(") && strings.HasSuffix(b.Keys[0].Text, ")") {
		return nil, p.snippet(b.Keys[0])
	}
	if len(b.Keys) == 0 {
		return nil, errAt(b.Pos, "server block without a key")
	}
	braced := !p.eof() && p.toks[p.i].Text == "{"
	if braced {
		p.i++
		p.depth = 1
	}
	ds, closed, err := p.lines(braced)
	p.depth = 0
	if err != nil {
		return nil, err
	}
	if braced && !closed {
		return nil, errAt(b.Pos, "server block %s: missing '}'", b.Keys[0].Text)
	}
	b.Directives = ds
	return b, nil
}

func (p *parser) snippet(key Token) error {
	name := key.Text[1 : len(key.Text)-1]
	if _, ok := p.snippets[name]; ok {
		return errAt(key.Pos, "snippet %s defined twice", name)
	}
	if p.eof() || p.toks[p.i].Text != "{" {
		return errAt(key.Pos, "snippet %s: expected '{'", name)
	}
	p.i++
	depth := 1
	start := p.i
	for ; !p.eof(); p.i++ {
		switch p.toks[p.i].Text {
		case "{":
			depth++
		case "}":
			depth--
		}
		if depth == 0 {
			p.snippets[name] = append([]Token(nil), p.toks[start:p.i]...)
			p.i++
			return nil
		}
	}
	return errAt(key.Pos, "snippet %s: missing '}'", name)
}

// lines reads directive lines until '}' (consumed; closed true) or EOF.
func (p *parser) lines(inBlock bool) (ds []*Directive, closed bool, err error) {
	for {
		if err := p.expandImport(); err != nil {
			return nil, false, err
		}
		if p.eof() {
			return ds, false, nil
		}
		t := p.toks[p.i]
		if t.Text == "}" {
			if !inBlock {
				return nil, false, errAt(t.Pos, "unexpected '}'")
			}
			p.i++
			return ds, true, nil
		}
		if t.Text == "{" {
			return nil, false, errAt(t.Pos, "unexpected '{' (a '{' ends the line that opens it)")
		}
		d := &Directive{Name: p.subst(t.Text), Pos: t.Pos}
		p.i++
		for !p.eof() && !p.newLine(p.i) {
			a := p.toks[p.i]
			if a.Text == "}" {
				// CoreDNS refuses a '}' after a directive on its line
				// (`.:53 { forward . 1.1.1.1 }`, `{ force_tcp }`).
				return nil, false, errAt(a.Pos, "%s: unexpected '}' on the directive's line (a '}' starts its own line)", d.Name)
			}
			p.i++
			if a.Text == "{" {
				if p.depth >= maxDepth {
					return nil, false, errAt(a.Pos, "%s: blocks nested more than %d deep (CoreDNS's directives nest two: a server block and a directive's options)", d.Name, maxDepth)
				}
				d.HasBlock = true
				p.depth++
				sub, closed, err := p.lines(true)
				p.depth--
				if err != nil {
					return nil, false, err
				}
				if !closed {
					return nil, false, errAt(d.Pos, "%s: missing '}'", d.Name)
				}
				d.Block = sub
				break
			}
			a.Text = p.subst(a.Text)
			d.Args = append(d.Args, a)
		}
		ds = append(ds, d)
	}
}

// ErrNoBlocks is returned by Load for a Corefile without server blocks.
var ErrNoBlocks = errors.New("no server blocks")
