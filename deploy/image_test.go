package deploy

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weft-dev/weft/internal/testenv"
)

// The image's binaries, built without Docker exactly as the Dockerfile's
// build stage builds them: its WORKDIR is a copy of the build context
// (the repository less Dockerfile.dockerignore), its ENV and ARG are the
// environment (with the build arguments compose can pass), and its RUN
// lines run through sh with /out mapped to a directory here. Then: the
// binaries are static and stripped, hold no path of the build machine,
// report the version passed in, and a master started as the runtime
// stage's USER (not root) migrates, serves and stops with status 0.
func TestImageBinariesAsDockerfileBuildsThem(t *testing.T) {
	stages := parseDockerfile(t, "Dockerfile")
	build, runtime := stages[0], stages[len(stages)-1]
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	buildArgs := map[string]string{"WEFT_VERSION": "v9.9.9-imagetest", "WEFT_REVISION": "0123456789abcdef-imagetest"}

	work := t.TempDir()
	ctxDir := filepath.Join(work, "context")
	copyContext(t, root, ctxDir, dockerignore(t, "Dockerfile.dockerignore"))
	outDir, err := os.MkdirTemp("", "weft-image-out-") // readable by the image's user
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(outDir) })
	if err := os.Chmod(outDir, 0o755); err != nil {
		t.Fatal(err)
	}

	env := map[string]string{}
	dir, workdir := "", ""
	ran := 0
	for _, ins := range build.instructions {
		op, rest, _ := strings.Cut(ins, " ")
		switch strings.ToUpper(op) {
		case "WORKDIR":
			dir, workdir = ctxDir, rest // the context is copied to the WORKDIR before any RUN that builds
		case "ENV", "ARG":
			for _, kv := range strings.Fields(rest) {
				k, v, hasDefault := strings.Cut(kv, "=")
				if strings.ToUpper(op) == "ARG" {
					a, given := buildArgs[k]
					if !given && !hasDefault {
						continue // an ARG neither given nor defaulted is unset in RUN
					}
					if given {
						v = a
					}
				}
				if workdir != "" && strings.HasPrefix(v, workdir+"/") { // a path in the WORKDIR (GOWORK)
					v = ctxDir + strings.TrimPrefix(v, workdir)
				}
				env[k] = v
			}
		case "COPY":
			if strings.HasPrefix(rest, "--from") {
				t.Fatalf("build stage: %q: this test knows only copies of the context", ins)
			}
		case "RUN":
			if dir == "" {
				t.Fatalf("build stage: RUN before WORKDIR")
			}
			cmdline := strings.ReplaceAll(rest, "/out/", outDir+"/")
			cmd := exec.Command("sh", "-c", cmdline)
			cmd.Dir = dir
			cmd.Env = append(goEnv(t), envList(env)...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("build stage: RUN %s: %v\n%s", rest, err, out)
			}
			ran++
		default:
			t.Fatalf("build stage: %q: this test does not know %s; teach it", ins, op)
		}
	}
	if ran == 0 || env["CGO_ENABLED"] != "0" {
		t.Fatalf("build stage ran %d RUN lines with CGO_ENABLED=%q", ran, env["CGO_ENABLED"])
	}

	for _, bin := range []string{"master", "worker"} {
		path := filepath.Join(outDir, bin)
		checkStatic(t, path)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(root)) || bytes.Contains(data, []byte(ctxDir)) {
			t.Errorf("%s holds a path of the build machine (GOFLAGS=-trimpath not applied)", bin)
		}
		out, err := exec.Command(path, "--version").Output()
		want := fmt.Sprintf("%s %s (revision %s,", bin, buildArgs["WEFT_VERSION"], buildArgs["WEFT_REVISION"])
		if err != nil || !strings.HasPrefix(string(out), want) {
			t.Errorf("%s --version: %q (%v), want it to start %q (the build arguments)", bin, out, err, want)
		}
	}

	// Run the master as the image would: as its USER, from /, with the
	// runtime stage's environment (the port moved to a free one).
	uid, gid := imageUser(t, runtime)
	if uid == 0 {
		t.Fatalf("runtime stage runs as root")
	}
	rds := testenv.StartRedis(t)
	db := testenv.NewDatabase(t)
	renv := map[string]string{}
	for _, ins := range runtime.instructions {
		if rest, ok := strings.CutPrefix(ins, "ENV "); ok {
			for _, kv := range strings.Fields(rest) {
				k, v, _ := strings.Cut(kv, "=")
				renv[k] = v
			}
		}
	}
	if renv["WEFT_HTTP_ADDR"] != "0.0.0.0:8080" {
		t.Errorf("runtime stage: WEFT_HTTP_ADDR=%q, want 0.0.0.0:8080", renv["WEFT_HTTP_ADDR"])
	}
	port := testenv.FreePort(t)
	renv["WEFT_HTTP_ADDR"] = fmt.Sprintf("0.0.0.0:%d", port)
	for k, v := range map[string]string{"WEFT_REDIS_URL": rds.URL(), "WEFT_DATABASE_URL": db, "WEFT_SECRET": "image-test-secret-0123456789",
		"WEFT_CLUSTER": "image", "PATH": "/usr/local/bin:/usr/bin:/bin"} {
		renv[k] = v
	}
	cmd := exec.Command(filepath.Join(outDir, "master"))
	cmd.Dir = "/"
	cmd.Env = envList(renv)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	} else {
		t.Logf("not root: the master runs as uid %d, itself not root", os.Geteuid())
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("master log:\n%s", logs.String())
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	testenv.WaitFor(t, 30*time.Second, func() error {
		select {
		case <-done:
			return fmt.Errorf("the master exited: %v", cmd.ProcessState)
		default:
		}
		body, err := httpGet(base + "/readyz")
		if err != nil {
			return err
		}
		if !strings.HasPrefix(body, "ready") {
			return fmt.Errorf("/readyz: %s", body)
		}
		return nil
	})
	status, err := httpGet(base + "/status")
	if err != nil || !strings.Contains(status, `"version": "`+buildArgs["WEFT_VERSION"]+`"`) {
		t.Errorf("/status: %v\n%s\nwant version %s", err, status, buildArgs["WEFT_VERSION"])
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("no exit 20 s after SIGTERM")
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("master as uid %d: exit %d after SIGTERM, want 0", uid, code)
	}
}

// checkStatic fails unless path is a statically linked, stripped ELF
// binary (CGO_ENABLED=0; -ldflags -s).
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s: has %v: dynamically linked", filepath.Base(path), p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s: needs %v", filepath.Base(path), libs)
	}
	if f.Section(".symtab") != nil {
		t.Errorf("%s: has a symbol table (-ldflags -s not applied)", filepath.Base(path))
	}
}

// imageUser is the runtime stage's USER uid:gid (numeric, as it must be
// for a non-root check to mean anything).
func imageUser(t *testing.T, s stage) (int, int) {
	t.Helper()
	user := ""
	for _, ins := range s.instructions {
		if u, ok := strings.CutPrefix(ins, "USER "); ok {
			user = u
		}
	}
	us, gs, _ := strings.Cut(user, ":")
	uid, err := strconv.Atoi(us)
	if err != nil {
		t.Fatalf("runtime stage: USER %q: want a numeric uid:gid", user)
	}
	gid := uid
	if gs != "" {
		if gid, err = strconv.Atoi(gs); err != nil {
			t.Fatalf("runtime stage: USER %q: want a numeric uid:gid", user)
		}
	}
	return uid, gid
}

// dockerignore reads the patterns of a .dockerignore file.
func dockerignore(t *testing.T, path string) []string {
	t.Helper()
	data := testenv.ReadFile(t, path)
	var out []string
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") {
			t.Fatalf("%s: %q: exceptions are not supported by this test", path, line)
		}
		out = append(out, line)
	}
	return out
}

// ignored matches a context-relative path the way the patterns of
// Dockerfile.dockerignore are written: a path from the root, or "**/"
// then a path at any depth, each element possibly a glob.
func ignored(rel string, patterns []string) bool {
	parts := strings.Split(rel, "/")
	for _, p := range patterns {
		anyDepth := strings.HasPrefix(p, "**/")
		pp := strings.Split(strings.TrimPrefix(p, "**/"), "/")
		for start := 0; start < len(parts); start++ {
			if !anyDepth && start > 0 {
				break
			}
			if len(parts)-start < len(pp) {
				break
			}
			match := true
			for i, el := range pp {
				if ok, _ := filepath.Match(el, parts[start+i]); !ok {
					match = false
					break
				}
			}
			if match {
				return true // the path or a directory above it
			}
		}
	}
	return false
}

func TestDockerignoreMatching(t *testing.T) {
	patterns := []string{".git", ".ci", "**/*.test", "**/testdata/fuzz"}
	for rel, want := range map[string]bool{
		".git": true, ".git/config": true, ".ci/run": true, "deploy/deploy.test": true, "weft.test": true,
		"catchup/testdata/fuzz/FuzzX/1": true, "catchup/testdata/keep.json": false, "cmd/master/main.go": false,
		"a/.git": false, "go.mod": false,
	} {
		if got := ignored(rel, patterns); got != want {
			t.Errorf("ignored(%q) = %v, want %v", rel, got, want)
		}
	}
}

// copyContext copies root to dst as docker would send it as the build
// context: without what the ignore patterns match.
func copyContext(t *testing.T, root, dst string, patterns []string) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if rel == "." {
			return os.MkdirAll(dst, 0o755)
		}
		if ignored(filepath.ToSlash(rel), patterns) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type().IsRegular():
			return copyFile(path, target)
		}
		return nil // symlinks and the like: none in the repository
	})
	if err != nil {
		t.Fatalf("copy the build context: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dst, ".git")); err == nil {
		t.Fatal("the context copy has .git: Dockerfile.dockerignore no longer excludes it")
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// goEnv is what the golang image provides around the Dockerfile's own
// settings: the go command, its caches (shared with this machine's, so
// nothing is fetched again), and the toolchain it has (GOTOOLCHAIN=local).
func goEnv(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOROOT", "GOCACHE", "GOMODCACHE", "GOPATH", "GOPROXY").Output()
	if err != nil {
		t.Fatal(err)
	}
	v := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(v) != 5 {
		t.Fatalf("go env: %q", out)
	}
	return []string{"PATH=" + filepath.Join(v[0], "bin") + ":/usr/bin:/bin", "HOME=" + os.Getenv("HOME"),
		"GOCACHE=" + v[1], "GOMODCACHE=" + v[2], "GOPATH=" + v[3], "GOPROXY=" + v[4], "GOTOOLCHAIN=local"}
}

func httpGet(u string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
