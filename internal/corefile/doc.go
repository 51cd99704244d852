// Package corefile reads the Corefile of the stock node-local-dns (CoreDNS's
// configuration language) into a typed model the daemon can run.
//
// Three layers, each usable alone:
//   - Render (render.go) turns node-cache's template (Corefile.base) into
//     the Corefile node-cache would write: the same substitutions, the same
//     stub-domain blocks, the same text.
//   - Parse (lex.go, parse.go) reads Corefile syntax as CoreDNS's parser
//     does: server blocks with several keys, snippets, import with globs
//     relative to the importing file, {$ENV}, comments, quotes. Every token
//     keeps its file and line, so every error names them.
//   - Load (model.go, directives.go) checks each directive against the
//     table of what we implement, in CoreDNS's plugin order, and builds a
//     Server per block: the server-level directives (bind, cache, forward,
//     ...) here, every other by the package that runs it, which registers
//     its parsing (Register, registry.go: CoreDNS's setup.go) and whose
//     configuration the block keeps by name (Server.Config). A directive
//     or option we do not implement is an error naming file, line,
//     directive and what is supported: nothing in a Corefile is silently
//     ignored (what CoreDNS itself skips is skipped and recorded: skip.go).
//
// It opens no sockets; it reads only the files it is pointed at.
package corefile
