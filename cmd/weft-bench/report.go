package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
)

// renderTable is the stdout table: every figure, weft against raw.
func renderTable(res Results) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tWEFT median (min-max)\tRAW median (min-max)\tRATIO\tGOAL\t")
	group := ""
	for _, f := range res.Figures {
		if f.Group != group {
			group = f.Group
			fmt.Fprintf(tw, "%s\t\t\t\t\t\n", group)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t\n", f.Name, statText(f.Weft, f.Unit), rawText(f), ratioText(f), goalText(f))
	}
	tw.Flush()
	for _, fl := range res.Failures {
		fmt.Fprintf(&b, "FAILED: %s\n", fl)
	}
	return b.String()
}

func statText(s Stat, unit string) string {
	if len(s.Runs) == 0 {
		return "n/a"
	}
	if len(s.Runs) > 1 {
		return fmt.Sprintf("%s %s (%s-%s)", num(s.Median), unit, num(s.Min), num(s.Max))
	}
	return num(s.Median) + " " + unit
}

func rawText(f Figure) string {
	if f.Raw == nil {
		return "-"
	}
	return statText(*f.Raw, f.Unit)
}

func ratioText(f Figure) string {
	if f.Ratio == nil {
		return "-"
	}
	return ratioNum(f.Ratio.Median)
}

// ratioNum is a ratio with two decimals, fewer from 10 up.
func ratioNum(r float64) string {
	switch {
	case r >= 100:
		return fmt.Sprintf("%.0f", r)
	case r >= 10:
		return fmt.Sprintf("%.1f", r)
	}
	return fmt.Sprintf("%.2f", r)
}

func goalText(f Figure) string {
	if f.Goal == nil || f.Met == nil {
		return ""
	}
	verdict := "MISSED"
	if *f.Met {
		verdict = "met"
	}
	return f.Goal.String(f.Unit) + ": " + verdict
}

// reports are where writeReports puts its files.
type reports struct {
	JSON, Markdown, Chart string
	Peers                 string // the peers' file to read, or ""
}

// writeReports writes the JSON, then the chart and the markdown from it.
func writeReports(res Results, to reports) error {
	for _, p := range []string{to.JSON, to.Markdown, to.Chart} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("results: %w", err)
	}
	if err := os.WriteFile(to.JSON, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("results: %w", err)
	}
	if err := writeChart(res, to.Chart); err != nil {
		return err
	}
	md, err := markdownFor(res, to)
	if err != nil {
		return err
	}
	if err := os.WriteFile(to.Markdown, []byte(md), 0o644); err != nil {
		return fmt.Errorf("markdown: %w", err)
	}
	return nil
}

// markdownFor is the doc for res with the peers' file and the chart of
// to, the links relative to the doc.
func markdownFor(res Results, to reports) (string, error) {
	var peers *Peers
	if to.Peers != "" {
		var err error
		if peers, err = readPeers(to.Peers); err != nil {
			return "", err
		}
	}
	dir := filepath.Dir(to.Markdown)
	rel := func(p string) string {
		if r, err := filepath.Rel(dir, p); err == nil {
			return filepath.ToSlash(r)
		}
		return filepath.ToSlash(p)
	}
	l := links{Chart: rel(to.Chart), Results: rel(to.JSON)}
	// The analysis behind the missed goals sits beside the results.
	if notes := filepath.Join(filepath.Dir(to.JSON), "notes.md"); fileExists(notes) {
		l.Notes = rel(notes)
	}
	if to.Peers != "" {
		l.Peers = rel(strings.TrimSuffix(to.Peers, ".jsonl") + ".md")
	}
	md := renderMarkdown(res, peers, l)
	// The consumers' pass (make peers-consumers) writes its section, links
	// relative to docs/, beside its results.
	if sec := filepath.Join(filepath.Dir(to.JSON), "consumers", "section.md"); fileExists(sec) {
		b, err := os.ReadFile(sec)
		if err != nil {
			return "", err
		}
		md += string(b)
	}
	return md, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
