package endpoint

import "time"

// RTTEstimator smooths round trips as TCP does for its retransmission
// timeout (RFC 6298, section 2): the first sample R sets SRTT = R and
// RTTVAR = R/2; each later one RTTVAR = 3/4 RTTVAR + 1/4 |SRTT - R|, then
// SRTT = 7/8 SRTT + 1/8 R. The zero value has no sample. Not safe for
// concurrent use.
type RTTEstimator struct {
	srtt, rttvar time.Duration
	samples      int
}

// Sample folds the round trip r in.
func (e *RTTEstimator) Sample(r time.Duration) {
	if e.samples == 0 {
		e.srtt, e.rttvar = r, r/2
	} else {
		d := e.srtt - r
		if d < 0 {
			d = -d
		}
		e.rttvar = (3*e.rttvar + d) / 4
		e.srtt = (7*e.srtt + r) / 8
	}
	e.samples++
}

// Timeout returns how long to wait for an answer: RFC 6298's
// retransmission timeout doubled for headroom, 2·SRTT + 4·RTTVAR, at
// least floor and at most ceiling; floor before any sample.
func (e *RTTEstimator) Timeout(floor, ceiling time.Duration) time.Duration {
	if e.samples == 0 {
		return floor
	}
	return min(max(2*e.srtt+4*e.rttvar, floor), ceiling)
}
