package localproxy

import (
	"context"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"
)

// handleProfiling serves net/http/pprof's handlers under /debug/pprof/
// (Config.Profiling). A CPU profile or an execution trace runs for the
// seconds asked (pprof's defaults: 30 and 1), longer than the health
// server's write timeout: their answer gets a write deadline of its own.
func handleProfiling(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/profile", longer(pprof.Profile, 30))
	mux.HandleFunc("/debug/pprof/trace", longer(pprof.Trace, 1))
}

// longer runs h, which takes the ?seconds= parameter (def if absent),
// with a write deadline that much past the health server's write
// timeout. pprof refuses a duration at least the server's WriteTimeout,
// read from the request's context: h sees a server without one.
func longer(h http.HandlerFunc, def float64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sec, err := strconv.ParseFloat(r.FormValue("seconds"), 64)
		if err != nil || sec <= 0 {
			sec = def
		}
		sec = min(sec, 24*3600) // no overflow below
		d := time.Duration(sec*float64(time.Second)) + healthWriteTimeout
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d))
		h(w, r.WithContext(context.WithValue(r.Context(), http.ServerContextKey, &http.Server{})))
	}
}
