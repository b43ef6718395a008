package version

import (
	"regexp"
	"runtime/debug"
	"testing"
)

func TestGet(t *testing.T) {
	info := func(settings ...debug.BuildSetting) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) { return &debug.BuildInfo{Settings: settings}, true }
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	for _, tc := range []struct {
		name          string
		v, rev        string
		read          func() (*debug.BuildInfo, bool)
		wantV, wantRv string
	}{
		{"nothing recorded", "", "", none, Release, "unknown"},
		{"vcs clean", "", "", info(debug.BuildSetting{Key: "vcs.revision", Value: "abc"}, debug.BuildSetting{Key: "vcs.modified", Value: "false"}), Release, "abc"},
		{"vcs dirty", "", "", info(debug.BuildSetting{Key: "vcs.revision", Value: "abc"}, debug.BuildSetting{Key: "vcs.modified", Value: "true"}), Release, "abc-dirty"},
		{"no vcs settings", "", "", info(debug.BuildSetting{Key: "GOOS", Value: "linux"}), Release, "unknown"},
		{"ldflags win", "v0.1.0-3-gabc", "def", info(debug.BuildSetting{Key: "vcs.revision", Value: "abc"}), "v0.1.0-3-gabc", "def"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := get(tc.v, tc.rev, tc.read)
			if got.Version != tc.wantV || got.Revision != tc.wantRv {
				t.Errorf("get = %+v, want version %q revision %q", got, tc.wantV, tc.wantRv)
			}
			if got.Go == "" || got.Platform == "" {
				t.Errorf("get = %+v: Go or Platform empty", got)
			}
		})
	}
}

func TestReleaseIsSemver(t *testing.T) {
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`).MatchString(Release) {
		t.Errorf("Release %q is not a semantic version with a leading v", Release)
	}
}

func TestString(t *testing.T) {
	i := Info{Version: "v1.2.3", Revision: "abc", Go: "go1.26.8", Platform: "linux/amd64"}
	if got, want := i.String(), "v1.2.3 (revision abc, go1.26.8 linux/amd64)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
