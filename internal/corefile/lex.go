package corefile

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Pos is where a token starts.
type Pos struct {
	File string
	Line int
}

func (p Pos) String() string { return fmt.Sprintf("%s:%d", p.File, p.Line) }

// Token is one word of a Corefile.
type Token struct {
	Text string
	Pos  Pos
	// endLine is the line the token ends on (a quoted token may span
	// lines); the next token is on a new line when it starts past it.
	endLine int
}

// lex splits a Corefile into tokens as CoreDNS's lexer does: whitespace
// separates tokens ('\r' is dropped); '#' starts a comment to the end of
// the line wherever it appears outside quotes (a token before it ends
// there); a token starting with '"' runs to the next unescaped '"', may
// span lines, and only `\"` is an escape (any other backslash is kept).
// It stops at the first token past maxTokens, or past maxDepth '{' open
// in this file (the parser checks the nesting across imports), so a
// hostile file costs no more than that much memory.
func lex(file string, data []byte) ([]Token, error) {
	var toks []Token
	line := 1
	var val []byte
	var start, depth int
	inComment, quoted, escaped := false, false, false
	var limit error
	emit := func() {
		t := Token{Text: string(val), Pos: Pos{File: file, Line: start}, endLine: line}
		toks = append(toks, t)
		val = val[:0]
		switch {
		case len(toks) > maxTokens:
			limit = errAt(t.Pos, "more than %d tokens", maxTokens)
		case t.Text == "{":
			if depth++; depth > maxDepth {
				limit = errAt(t.Pos, "blocks nested more than %d deep (CoreDNS's directives nest two: a server block and a directive's options)", maxDepth)
			}
		case t.Text == "}":
			depth--
		}
	}
	for i := 0; i < len(data) && limit == nil; {
		r, size := utf8.DecodeRune(data[i:])
		i += size
		if quoted {
			switch {
			case escaped:
				if r != '"' {
					val = append(val, '\\')
				}
				val = utf8.AppendRune(val, r)
				escaped = false
			case r == '\\':
				escaped = true
			case r == '"':
				quoted = false
				emit()
			default:
				val = utf8.AppendRune(val, r)
			}
			if r == '\n' {
				line++
			}
			continue
		}
		if unicode.IsSpace(r) {
			if r == '\r' {
				continue
			}
			if len(val) > 0 {
				emit()
			}
			if r == '\n' {
				line++
				inComment = false
			}
			continue
		}
		if r == '#' {
			inComment = true
		}
		if inComment {
			continue
		}
		if len(val) == 0 {
			start = line
			if r == '"' {
				quoted = true
				continue
			}
		}
		val = utf8.AppendRune(val, r)
	}
	if limit != nil {
		return nil, limit
	}
	if quoted {
		return nil, errAt(Pos{File: file, Line: start}, "unterminated quoted string")
	}
	if len(val) > 0 {
		emit()
	}
	return toks, limit
}
