module github.com/nodelocaldns/nodelocaldns/bench

go 1.26.8

require (
	golang.org/x/image v0.47.0
	golang.org/x/net v0.62.0
)
