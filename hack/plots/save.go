package plots

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// save draws into a canvas of w×h in the format of path's extension and
// writes it to path (through a temporary file: a reader never sees half
// a chart).
func save(path string, w, h vg.Length, drawFn func(draw.Canvas)) (err error) {
	format := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	if format != "svg" && format != "png" {
		return fmt.Errorf("plots: %s: want a .svg or .png file", path)
	}
	c, err := draw.NewFormattedCanvas(w, h, format)
	if err != nil {
		return fmt.Errorf("plots: %w", err)
	}
	drawFn(draw.New(c))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("plots: writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
