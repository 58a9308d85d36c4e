package netnslab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// LockDir holds one lock file per live lab (<prefix>.lock, flock-ed by its owner for
// the lab's lifetime) and one marker per detached lab (<prefix>.detached). It is on
// tmpfs, like /run/netns, so both vanish together on reboot.
const LockDir = "/run/netnslab"

// labLock is an exclusive flock on a lab's lock file. The kernel drops it when its
// owner dies, which is what tells a crashed lab from a live one.
type labLock struct {
	prefix string
	f      *os.File
}

func lockPath(prefix string) string     { return filepath.Join(LockDir, prefix+".lock") }
func detachedPath(prefix string) string { return filepath.Join(LockDir, prefix+".detached") }

// acquireLabLock takes the lab's lock without blocking, or returns ErrLabBusy.
func acquireLabLock(prefix string) (*labLock, error) {
	if err := os.MkdirAll(LockDir, 0o755); err != nil {
		return nil, fmt.Errorf("netnslab: %w", err)
	}
	path := lockPath(prefix)
	// A bounded retry: the file may be unlinked by its previous holder between our
	// open and our flock, leaving us a lock on an orphaned inode.
	for range 5 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("netnslab: lock %s: %w", prefix, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w: %s", ErrLabBusy, prefix)
			}
			return nil, fmt.Errorf("netnslab: lock %s: %w", prefix, err)
		}
		var held, onDisk unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(path, &onDisk) == nil &&
			held.Ino == onDisk.Ino && held.Dev == onDisk.Dev {
			_ = f.Truncate(0)
			fmt.Fprintf(f, "%d\n", os.Getpid()) // for humans only
			return &labLock{prefix: prefix, f: f}, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("%w: %s (lock file keeps changing)", ErrLabBusy, prefix)
}

func (k *labLock) detached() bool {
	_, err := os.Stat(detachedPath(k.prefix))
	return err == nil
}

// release drops the lock and leaves the file (another process may be opening it).
func (k *labLock) release() { k.f.Close() }

// remove deletes the lock file and the detached marker while still holding the lock,
// then releases it.
func (k *labLock) remove() error {
	err := removeIfExists(detachedPath(k.prefix))
	err = errors.Join(err, removeIfExists(lockPath(k.prefix)))
	k.f.Close()
	return err
}

// detach writes the detached marker and releases the lock.
func (k *labLock) detach() error {
	err := os.WriteFile(detachedPath(k.prefix), []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644)
	if err == nil {
		err = removeIfExists(lockPath(k.prefix))
	}
	k.f.Close()
	if err != nil {
		return fmt.Errorf("netnslab: detach %s: %w", k.prefix, err)
	}
	return nil
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("netnslab: %w", err)
	}
	return nil
}

// CleanupStale removes the leftovers of crashed labs whose prefix starts with prefix
// (GlobalPrefix sweeps them all): namespaces of labs that no live process holds and
// that are not detached. Live and detached labs are left alone, so it is safe to call
// while other test processes run their labs. It returns the removed namespaces.
func CleanupStale(prefix string) ([]string, error) {
	if !strings.HasPrefix(prefix, GlobalPrefix) {
		return nil, fmt.Errorf("netnslab: stale prefix %q does not start with %q", prefix, GlobalPrefix)
	}
	labs, err := labsWithPrefix(prefix)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, lab := range labs {
		lock, err := acquireLabLock(lab)
		if errors.Is(err, ErrLabBusy) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if lock.detached() {
			lock.release()
			continue
		}
		names := labNamespaces(lab)
		if err := removeNamespaces(func(string, ...any) {}, names); err != nil {
			errs = append(errs, err)
			lock.release()
			continue
		}
		removed = append(removed, names...)
		errs = append(errs, lock.remove())
	}
	return removed, errors.Join(errs...)
}

// RemoveLab deletes a lab that no live process holds, detached or not (zlab down). It
// returns the removed namespaces; a lab that does not exist is not an error.
func RemoveLab(prefix string) ([]string, error) {
	if !prefixRE.MatchString(prefix) {
		return nil, fmt.Errorf("netnslab: invalid prefix %q: want %s", prefix, prefixRE)
	}
	lock, err := acquireLabLock(prefix)
	if err != nil {
		return nil, err
	}
	names := labNamespaces(prefix)
	if err := removeNamespaces(func(string, ...any) {}, names); err != nil {
		lock.release()
		return nil, err
	}
	return names, lock.remove()
}

// labsWithPrefix lists the lab prefixes that have namespaces or lock-dir files.
func labsWithPrefix(prefix string) ([]string, error) {
	seen := map[string]bool{}
	var labs []string
	add := func(lab string) {
		if strings.HasPrefix(lab, prefix) && prefixRE.MatchString(lab) && !seen[lab] {
			seen[lab] = true
			labs = append(labs, lab)
		}
	}
	names, err := listNamespaces()
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		add(labOf(n))
	}
	// Lock files of labs that crashed before creating a namespace.
	ents, _ := os.ReadDir(LockDir)
	for _, e := range ents {
		if lab, ok := strings.CutSuffix(e.Name(), ".lock"); ok {
			add(lab)
		}
	}
	return labs, nil
}
