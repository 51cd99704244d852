package snapshot

import (
	"encoding/hex"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// bootIDFile names the running kernel's boot (a random UUID per boot).
const bootIDFile = "/proc/sys/kernel/random/boot_id"

// Now is wall (the cache's clock) with this boot's clock and id. Without
// them (no /proc) Age uses the wall clock alone.
func Now(wall time.Time) Times {
	t := Times{Wall: wall.UnixNano()}
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return t
	}
	b, err := os.ReadFile(bootIDFile)
	if err != nil {
		return t
	}
	id, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(b)), "-", ""))
	if err != nil || len(id) != 16 {
		return t
	}
	t.Boot = ts.Nano()
	copy(t.BootID[:], id)
	return t
}
