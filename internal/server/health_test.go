package server

import (
	"context"
	"testing"
	"time"
)

// The health check passes while the server serves, through its real
// socket, and fails once it has stopped.
func TestHealthThroughTheListener(t *testing.T) {
	s, _ := startServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Health(ctx); err != nil {
		t.Fatalf("serving: %v", err)
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Health(ctx); err == nil {
		t.Fatal("healthy after shutdown")
	}
}
