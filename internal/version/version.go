// Package version holds apifailover's release version and the revision a
// binary was built from.
//
// Release is the one place the version is written: the localproxy
// manifests reference the image tagged with it (a test checks that), and
// hack/tools/build-image.sh tags the image with it and with the revision.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Release is the version of this source tree.
const Release = "v0.1.0"

// Set at build time where the Go toolchain cannot read them from the
// repository (a container build without .git):
//
//	-ldflags "-X github.com/apifailover/apifailover/internal/version.version=v0.1.0-3-gabc1234
//	          -X github.com/apifailover/apifailover/internal/version.revision=abc1234..."
var (
	version  = ""
	revision = ""
)

// Info describes a build.
type Info struct {
	// Version is the release version, or what the build set instead
	// (git describe output, for instance).
	Version string
	// Revision is the VCS revision, with "-dirty" when the tree had
	// uncommitted changes; "unknown" when the build recorded none.
	Revision string
	// Go is the Go toolchain version, Platform GOOS/GOARCH.
	Go, Platform string
}

// Get returns the build's Info.
func Get() Info {
	return get(version, revision, debug.ReadBuildInfo)
}

func get(v, rev string, read func() (*debug.BuildInfo, bool)) Info {
	i := Info{Version: v, Revision: rev, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if i.Version == "" {
		i.Version = Release
	}
	if i.Revision == "" {
		i.Revision = "unknown"
		if bi, ok := read(); ok {
			var r, modified string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					r = s.Value
				case "vcs.modified":
					modified = s.Value
				}
			}
			if r != "" {
				i.Revision = r
				if modified == "true" {
					i.Revision += "-dirty"
				}
			}
		}
	}
	return i
}

// String formats i as one line: "v0.1.0 (revision 0123abcd, go1.26.8 linux/amd64)".
func (i Info) String() string {
	return fmt.Sprintf("%s (revision %s, %s %s)", i.Version, i.Revision, i.Go, i.Platform)
}
