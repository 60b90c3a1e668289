//! A small file whose changes every reader must see, at the cost of at most one `fstat` a
//! millisecond: the file is held open, and while the held one is still linked (a change that
//! replaces the file by rename unlinks the old one) it is the file in place, its size and
//! modification time telling of a change written into it. Only when it was replaced is the
//! path looked up again. A look stands for [`TRUSTED_FOR`]: a change by another process is
//! seen by every look that starts that long after it; this process's own changes call
//! [`Watched::forget`] and are seen by the next look.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// How long a look at the file stands for. (A system call is a microsecond on a loaded
/// machine, as much as the rest of a key's check.)
pub const TRUSTED_FOR: Duration = Duration::from_millis(1);

/// Which content of the file is in place: another file, another size or another
/// modification time is another version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    inode: u64,
    modified: Option<SystemTime>,
    pub len: u64,
}

impl Version {
    fn of(m: &std::fs::Metadata) -> Version {
        Version {
            inode: m.ino(),
            modified: m.modified().ok(),
            len: m.len(),
        }
    }
}

/// One watched path and the file held open for it.
#[derive(Debug)]
pub struct Watched {
    path: PathBuf,
    held: Option<File>,
    /// The last look: when, and what it found.
    last: Option<(Instant, Option<Version>)>,
}

impl Watched {
    pub fn new(path: &Path) -> Watched {
        Watched {
            path: path.to_path_buf(),
            held: None,
            last: None,
        }
    }

    /// The version in place now (as of at most [`TRUSTED_FOR`] ago); `None` when there is no
    /// file.
    pub fn version(&mut self) -> std::io::Result<Option<Version>> {
        let now = Instant::now();
        if let Some((at, version)) = self.last {
            if now.saturating_duration_since(at) < TRUSTED_FOR {
                return Ok(version);
            }
        }
        let version = self.look()?;
        self.last = Some((now, version));
        Ok(version)
    }

    /// Forgets the last look: the next one reads the file system (after a change made here).
    pub fn forget(&mut self) {
        self.last = None;
    }

    fn look(&mut self) -> std::io::Result<Option<Version>> {
        if let Some(f) = &self.held {
            match f.metadata() {
                Ok(m) if m.nlink() > 0 => return Ok(Some(Version::of(&m))),
                _ => self.held = None,
            }
        }
        match File::open(&self.path) {
            Ok(f) => {
                let m = f.metadata()?;
                self.held = Some(f);
                Ok(Some(Version::of(&m)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replacement_a_write_in_place_and_a_removal_are_each_seen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stamp");
        let mut w = Watched::new(&path);
        // Each look after a change here is told to forget the last (as writers here do).
        let mut version = || {
            w.forget();
            w.version().unwrap()
        };
        assert_eq!(version(), None);
        std::fs::write(&path, "1").unwrap();
        let first = version().unwrap();
        assert_eq!(version(), Some(first), "unchanged");
        // Replaced by rename, with the same size: another file.
        let tmp = dir.path().join("stamp.new");
        std::fs::write(&tmp, "2").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let second = version().unwrap();
        assert_ne!(second, first);
        // Written in place, longer.
        std::fs::write(&path, "three").unwrap();
        let third = version().unwrap();
        assert_ne!(third, second);
        assert_eq!(third.len, 5);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(version(), None);
    }

    #[test]
    fn a_look_stands_for_a_moment_and_no_longer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stamp");
        std::fs::write(&path, "1").unwrap();
        let mut w = Watched::new(&path);
        let first = w.version().unwrap();
        std::fs::write(&path, "22").unwrap();
        // A look that starts TRUSTED_FOR after the last one reads the file system again.
        std::thread::sleep(TRUSTED_FOR);
        let seen = w.version().unwrap();
        assert_ne!(seen, first);
        assert_eq!(seen.map(|v| v.len), Some(2));
        // And forgetting makes the next look read it at once.
        std::fs::write(&path, "333").unwrap();
        w.forget();
        assert_eq!(w.version().unwrap().map(|v| v.len), Some(3));
    }
}
