package running

import "github.com/nodelocaldns/nodelocaldns/internal/config"

// reportSkipped logs each entry of the Corefile skipped as the stock skips
// it (corefile.Skip) once, at start or at the first reload that has it
// (an edit that only moves it to another line does not log it again), and
// sets nodelocaldns_config_skipped_entries for the Corefile. Owned by the
// reload goroutine (and New before it).
func (d *State) reportSkipped(cc *config.CorefileConfig) {
	if cc == nil {
		return
	}
	if d.Metrics != nil {
		d.Metrics.Directives.SetCorefileSkipped(cc.Path, len(cc.Skipped))
	}
	now := make(map[string]bool, len(cc.Skipped))
	for _, k := range cc.Skipped {
		s := k.Pos.File + "\x00" + k.Directive + "\x00" + k.Entry + "\x00" + k.Why
		if !d.reload.cf.skipped[s] {
			d.log.Warn("Corefile entry skipped, as the stock node-cache skips it", "at", k.Pos.String(), "directive", k.Directive, "entry", k.Entry, "why", k.Why)
		}
		now[s] = true
	}
	d.reload.cf.skipped = now
}
