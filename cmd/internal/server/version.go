package server

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time when the build has no VCS information to stamp (a
// Docker build context has no .git, nor has a git worktree for the go
// command):
//
//	go build -ldflags "-X github.com/weft-dev/weft/cmd/internal/server.linkVersion=v1.2.0 -X github.com/weft-dev/weft/cmd/internal/server.linkRevision=$(git rev-parse HEAD)"
//
// Empty values fall back to the build info.
var linkVersion, linkRevision string

// Version is this build's version (Build().Version), reported in HELLO.
var Version = Build().Version

// BuildInfo says which build of weft a binary is: /status and the start
// line carry it, `master --version` and `worker --version` print it.
type BuildInfo struct {
	// Version is the module version ("v1.2.0", a pseudo-version), or
	// "(devel)" when the go command knew none.
	Version string
	// Revision is the VCS revision the binary was built from, with
	// "+modified" when the work tree had changes, or "unknown".
	Revision  string
	GoVersion string
}

func (b BuildInfo) String() string {
	return fmt.Sprintf("%s (revision %s, %s %s/%s)", b.Version, b.Revision, b.GoVersion, runtime.GOOS, runtime.GOARCH)
}

// Build returns this binary's build information.
func Build() BuildInfo {
	b := BuildInfo{Version: "(devel)", Revision: "unknown", GoVersion: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		if v := info.Main.Version; v != "" {
			b.Version = v
		}
		modified := false
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && b.Revision != "unknown" {
			b.Revision += "+modified"
		}
	}
	if linkVersion != "" {
		b.Version = linkVersion
	}
	if linkRevision != "" {
		b.Revision = linkRevision
	}
	return b
}
