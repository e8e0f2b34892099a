package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/weft-dev/weft/internal/testenv"
)

// stage is one FROM section of a Dockerfile, with its instructions joined
// across line continuations.
type stage struct {
	from         string
	instructions []string
}

func parseDockerfile(t *testing.T, path string) []stage {
	t.Helper()
	data := testenv.ReadFile(t, path)
	var stages []stage
	var cur string
	// ARGs before the first FROM: the base images, which FROM names as
	// ${NAME}; their defaults are what a plain `docker build` uses.
	global := map[string]string{}
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if cur == "" && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if next, ok := strings.CutSuffix(line, "\\"); ok {
			cur += next + " "
			continue
		}
		ins := strings.Join(strings.Fields(cur+line), " ")
		cur = ""
		if strings.HasPrefix(strings.ToUpper(ins), "FROM ") {
			stages = append(stages, stage{from: os.Expand(ins, func(k string) string { return global[k] })})
			continue
		}
		if rest, ok := strings.CutPrefix(ins, "ARG "); ok && len(stages) == 0 {
			k, v, _ := strings.Cut(rest, "=")
			global[k] = v
			continue
		}
		if len(stages) == 0 {
			t.Fatalf("%s: %q before the first FROM", path, ins)
		}
		last := &stages[len(stages)-1]
		last.instructions = append(last.instructions, ins)
	}
	return stages
}

func (s stage) has(pattern string) bool {
	re := regexp.MustCompile(pattern)
	for _, ins := range s.instructions {
		if re.MatchString(ins) {
			return true
		}
	}
	return false
}

// The image the compose file builds: static binaries of both commands, a
// runtime with the sh and wget the compose file uses, not running as root.
func TestComposeDockerfile(t *testing.T) {
	stages := parseDockerfile(t, "Dockerfile")
	if len(stages) < 2 {
		t.Fatalf("Dockerfile: %d stages, want a build stage and a runtime stage", len(stages))
	}
	build, runtime := stages[0], stages[len(stages)-1]
	if !strings.Contains(build.from, "golang:") || !strings.HasSuffix(build.from, " AS build") {
		t.Errorf("Dockerfile: first stage %q, want FROM golang:... AS build", build.from)
	}
	if !build.has(`^ENV .*\bCGO_ENABLED=0\b`) {
		t.Errorf("Dockerfile: build stage does not set CGO_ENABLED=0 (static binaries)")
	}
	for _, cmd := range []string{"master", "worker"} {
		if !build.has(`go build .*-o /out/` + cmd + ` \./cmd/` + cmd + `\b`) {
			t.Errorf("Dockerfile: build stage does not build ./cmd/%s", cmd)
		}
		if !runtime.has(`^COPY --from=build .*/out/` + cmd + `\b`) {
			t.Errorf("Dockerfile: runtime stage does not copy %s", cmd)
		}
	}
	// Every module of go.work has its go.mod copied before the download,
	// or is dropped from the image's workspace: otherwise go mod download
	// fails ("cannot load module ... listed in go.work file"), as it did
	// when bench/consumers joined go.work.
	work := testenv.ReadFile(t, "../go.work")
	for _, m := range regexp.MustCompile(`(?m)^\s+\./(\S+)$`).FindAllSubmatch(work, -1) {
		dir := regexp.QuoteMeta(string(m[1]))
		if !build.has(`^COPY `+dir+`/go\.mod `+dir+`/go\.sum \./`+dir+`/$`) && !build.has(`go work edit .*-dropuse=\./`+dir+`\b`) {
			t.Errorf("Dockerfile: go.work's module ./%s is neither copied (its go.mod and go.sum) before go mod download nor dropped from the image's workspace", m[1])
		}
	}
	if !build.has(`^ENV GOWORK=`) && build.has(`-dropuse`) {
		t.Errorf("Dockerfile: a module dropped from a workspace the build does not use")
	}
	// sh (the worker's command) and wget (healthchecks) are busybox's.
	if !strings.HasPrefix(runtime.from, "FROM alpine:") {
		t.Errorf("Dockerfile: runtime %q, want alpine (compose uses its sh and wget)", runtime.from)
	}
	if !runtime.has(`^USER `) || runtime.has(`^USER (root|0)\b`) {
		t.Errorf("Dockerfile: runtime stage must switch to a non-root USER")
	}
	if !runtime.has(`^EXPOSE 8080$`) {
		t.Errorf("Dockerfile: runtime stage does not EXPOSE 8080")
	}
	if runtime.has(`^ENTRYPOINT `) {
		t.Errorf("Dockerfile: an ENTRYPOINT would be prepended to the services' commands, which name the binary")
	}
}
