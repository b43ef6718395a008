package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// backupSuffix is the time format of a backup's name, FILE.<UTC time>.bak.
const backupSuffix = "20060102T150405Z"

// replaceFile replaces the file at path (if a symlink, the file it points
// to) with data, after writing old, its content, to a backup beside it,
// path.<now in UTC>.bak. An existing backup is never overwritten. The
// backup and the new file get the mode and owner of the old one. It
// returns the backup's name.
func replaceFile(path string, old, data []byte, now time.Time) (string, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("rewriting %s: %w", path, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("rewriting %s: %w", path, err)
	}
	backup := real + "." + now.UTC().Format(backupSuffix) + ".bak"
	tmp, err := writeTemp(real, old, fi)
	if err != nil {
		return "", fmt.Errorf("backing up %s: %w", path, err)
	}
	// A link, unlike a rename, fails if the backup exists.
	err = os.Link(tmp, backup)
	os.Remove(tmp)
	if errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("backing up %s: %s exists already; not overwriting it, and %s is left as it is (run again in a second)", path, backup, path)
	}
	if err != nil {
		return "", fmt.Errorf("backing up %s: %w", path, err)
	}
	if err := replace(real, data, fi); err != nil {
		return "", fmt.Errorf("rewriting %s (the old one is in %s): %w", path, backup, err)
	}
	return backup, nil
}

// writeOut writes data to path (if a symlink, the file it points to)
// atomically, with the mode and owner of the file it replaces, or mode
// 0600 if there is none.
func writeOut(path string, data []byte) error {
	real := path
	fi, err := os.Stat(path)
	switch {
	case err == nil:
		// A symlink stays one: write the file it points to.
		if real, err = filepath.EvalSymlinks(path); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
	case errors.Is(err, fs.ErrNotExist):
		fi = nil
	default:
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := replace(real, data, fi); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// replace writes data to a temporary file beside path and renames it over
// path, then syncs the directory, so that path holds either the old or
// the new content, also after a crash. like, if not nil, gives the mode
// and owner.
func replace(path string, data []byte, like fs.FileInfo) error {
	tmp, err := writeTemp(path, data, like)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(path))
}

// writeTemp writes data to a new temporary file in path's directory,
// synced to disk, with like's mode and owner (mode 0600 and the caller's
// owner if like is nil), and returns its name.
func writeTemp(path string, data []byte, like fs.FileInfo) (name string, err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	mode := fs.FileMode(0o600)
	if like != nil {
		mode = like.Mode().Perm()
		if err := sameOwner(f, like); err != nil {
			return "", err
		}
	}
	if err := f.Chmod(mode); err != nil {
		return "", err
	}
	if _, err := f.Write(data); err != nil {
		return "", err
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	return f.Name(), f.Close()
}

// sameOwner gives f the owner and group of like, if they differ (a file
// written by root for another user stays that user's).
func sameOwner(f *os.File, like fs.FileInfo) error {
	want, ok := like.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if have, ok := fi.Sys().(*syscall.Stat_t); ok && have.Uid == want.Uid && have.Gid == want.Gid {
		return nil
	}
	if err := f.Chown(int(want.Uid), int(want.Gid)); err != nil {
		return fmt.Errorf("keeping the owner %d:%d of %s: %w", want.Uid, want.Gid, like.Name(), err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// sameFile reports whether a and b are the same existing file.
func sameFile(a, b string) bool {
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}
