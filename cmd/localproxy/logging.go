package main

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
)

// parseLogLevel turns --log-level into a slog level: logr's V(n) logs at
// slog level -n, so verbosity n shows V(0) to V(n).
func parseLogLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "error":
		return slog.LevelError, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "debug":
		return slog.Level(-4), nil
	case "warn", "warning", "dpanic", "panic", "fatal":
		// extractedprism's (zap's) levels: localproxy logs no warnings
		// apart from its information lines, and never panics or exits
		// on a log line, so all of them show errors only.
		return slog.LevelError, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 10 {
		return 0, fmt.Errorf("want error, info, debug, a verbosity 0-10, or extractedprism's warn, dpanic, panic or fatal (taken as error)")
	}
	return slog.Level(-n), nil
}

// newLogger returns a logr.Logger backed by log/slog, as text or JSON.
func newLogger(w io.Writer, format string, level slog.Level) logr.Logger {
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		// V(n) lines log at slog level -n: show them as DEBUG with v=n
		// rather than as "DEBUG+3".
		if a.Key == slog.LevelKey && len(groups) == 0 {
			if l, ok := a.Value.Any().(slog.Level); ok && l < slog.LevelInfo {
				return slog.String(slog.LevelKey, "DEBUG"+strconv.Itoa(int(-l)))
			}
		}
		return a
	}}
	var h slog.Handler
	if format == "json" {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	return logr.FromSlogHandler(h)
}
