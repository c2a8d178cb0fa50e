//! The context keys: an Ed25519 signing key that only the gateway holds,
//! and the verifying (public) keys every worker holds.
//!
//! Files are text, one `KID HEX` per line, `#` comments:
//! - `context.sign`: one line, the key id and the 32-byte private seed
//!   (the gateway's alone, 0600);
//! - `context.pub`: one line per accepted key, the key id and the 32-byte
//!   public key (the current signing key's first).
//!
//! A key is rotated by adding the new public key to every `context.pub`,
//! then giving the gateways the new `context.sign`, then dropping the old
//! public key. A worker's files hold nothing that signs: whatever a
//! compromised worker has, no other worker accepts a context it makes.

use super::{ContextError, MAX_HEADER, SKEW_MS, TenantContext, millis};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use std::path::Path;
use std::time::SystemTime;

/// The form tag of a signed context header.
const FORM: &str = "v2";

/// Why a key file could not be loaded or written.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read or written.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// A line is not `KID HEX` with a 32-byte key.
    #[error(
        "{0}: line {1} is not `KID HEX` (a key id of 1 to 32 letters, digits or -, and a 32-byte key in hex)"
    )]
    Format(String, usize),
    /// No key at all, or (a signing file) more than one.
    #[error("{0}: {1}")]
    Count(String, &'static str),
}

/// The gateway's signing key (cheap to clone: the key is shared).
#[derive(Clone)]
pub struct SigningKey {
    kid: String,
    pair: std::sync::Arc<Ed25519KeyPair>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .finish()
    }
}

/// The public keys a worker accepts contexts under.
#[derive(Debug, Clone, Default)]
pub struct VerifyingKeys {
    keys: Vec<(String, [u8; 32])>,
}

/// The `KID HEX` lines of `text`, each key exactly 32 bytes.
fn lines(text: &str, origin: &str) -> Result<Vec<(String, [u8; 32])>, KeyFileError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || KeyFileError::Format(origin.to_owned(), i + 1);
        let (kid, hex_key) = line.split_once(char::is_whitespace).ok_or_else(bad)?;
        let kid_ok = !kid.is_empty()
            && kid.len() <= 32
            && kid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        let key = hex::decode(hex_key.trim())
            .ok()
            .and_then(|k| <[u8; 32]>::try_from(k.as_slice()).ok());
        match (kid_ok, key) {
            (true, Some(key)) => out.push((kid.to_owned(), key)),
            _ => return Err(bad()),
        }
    }
    Ok(out)
}

fn read(path: &Path) -> Result<String, KeyFileError> {
    std::fs::read_to_string(path).map_err(|e| KeyFileError::Io(path.display().to_string(), e))
}

fn random<const N: usize>() -> Option<[u8; N]> {
    let mut b = [0u8; N];
    SystemRandom::new().fill(&mut b).ok()?;
    Some(b)
}

impl SigningKey {
    /// The key with id `kid` from its 32-byte private seed.
    pub fn from_seed(kid: &str, seed: &[u8; 32]) -> Option<SigningKey> {
        let pair = Ed25519KeyPair::from_seed_unchecked(seed).ok()?;
        Some(SigningKey {
            kid: kid.to_owned(),
            pair: std::sync::Arc::new(pair),
        })
    }

    /// A fresh key no file holds (tests, benchmarks, a gateway's own
    /// checks).
    pub fn generate() -> SigningKey {
        let kid = random::<4>().map(hex::encode).unwrap_or_else(|| "k".into());
        let seed = random::<32>().unwrap_or([7; 32]);
        // A 32-byte seed always makes a key.
        SigningKey::from_seed(&kid, &seed).unwrap_or_else(|| unreachable!())
    }

    /// Parses a signing file: exactly one `KID HEX-SEED` line.
    pub fn parse(text: &str, origin: &str) -> Result<SigningKey, KeyFileError> {
        let keys = lines(text, origin)?;
        let [(kid, seed)] = keys.as_slice() else {
            return Err(KeyFileError::Count(
                origin.to_owned(),
                "a signing file holds exactly one key",
            ));
        };
        SigningKey::from_seed(kid, seed).ok_or_else(|| KeyFileError::Format(origin.to_owned(), 1))
    }

    /// Loads a signing file.
    pub fn load(path: &Path) -> Result<SigningKey, KeyFileError> {
        SigningKey::parse(&read(path)?, &path.display().to_string())
    }

    /// Writes a new signing file at `sign` and its public key as the only
    /// line of `public` (both 0600), unless `sign` exists; a missing
    /// `public` is then derived from it. Returns the files written.
    pub fn create(sign: &Path, public: &Path) -> Result<Vec<std::path::PathBuf>, KeyFileError> {
        let mut written = Vec::new();
        let key = if sign.exists() {
            SigningKey::load(sign)?
        } else {
            let io = |e| KeyFileError::Io(sign.display().to_string(), e);
            let kid = random::<4>().ok_or_else(|| io(std::io::Error::other("no randomness")))?;
            let seed = random::<32>().ok_or_else(|| io(std::io::Error::other("no randomness")))?;
            let text = format!(
                "# Bulkhead tenant-context signing key (the gateway's alone): `KID SEED`.\n{} {}\n",
                hex::encode(kid),
                hex::encode(seed)
            );
            write_private(sign, text.as_bytes()).map_err(io)?;
            written.push(sign.to_path_buf());
            SigningKey::parse(&text, &sign.display().to_string())?
        };
        if !public.exists() {
            let text = format!(
                "# Bulkhead tenant-context verifying keys: `KID PUBLIC-KEY`; any verifies.\n{}\n",
                key.public_line()
            );
            write_private(public, text.as_bytes())
                .map_err(|e| KeyFileError::Io(public.display().to_string(), e))?;
            written.push(public.to_path_buf());
        }
        Ok(written)
    }

    /// Its `KID PUBLIC-KEY` line, for a `context.pub`.
    pub fn public_line(&self) -> String {
        format!(
            "{} {}",
            self.kid,
            hex::encode(self.pair.public_key().as_ref())
        )
    }

    /// The verifying keys of this key alone.
    pub fn verifying(&self) -> VerifyingKeys {
        let mut pk = [0u8; 32];
        pk.copy_from_slice(self.pair.public_key().as_ref());
        VerifyingKeys {
            keys: vec![(self.kid.clone(), pk)],
        }
    }

    /// Signs `ctx`: the header value `v2.KID.PAYLOAD.SIGNATURE`.
    pub fn sign(&self, ctx: &TenantContext) -> String {
        let payload = B64.encode(serde_json::to_vec(ctx).unwrap_or_default());
        let signed = format!("{FORM}.{}.{payload}", self.kid);
        let sig = self.pair.sign(signed.as_bytes());
        format!("{signed}.{}", B64.encode(sig.as_ref()))
    }
}

impl VerifyingKeys {
    /// Keys that verify nothing (a worker that serves no generate calls).
    pub fn none() -> VerifyingKeys {
        VerifyingKeys::default()
    }

    /// Parses a verifying file: one or more `KID HEX-PUBLIC-KEY` lines.
    pub fn parse(text: &str, origin: &str) -> Result<VerifyingKeys, KeyFileError> {
        let keys = lines(text, origin)?;
        if keys.is_empty() {
            return Err(KeyFileError::Count(origin.to_owned(), "no key"));
        }
        Ok(VerifyingKeys { keys })
    }

    /// Loads a verifying file.
    pub fn load(path: &Path) -> Result<VerifyingKeys, KeyFileError> {
        VerifyingKeys::parse(&read(path)?, &path.display().to_string())
    }

    /// These keys and `other`'s (a rotation in a test).
    pub fn and(mut self, other: &VerifyingKeys) -> VerifyingKeys {
        self.keys.extend(other.keys.iter().cloned());
        self
    }

    /// The statement in `header` if one of these keys signed it, its
    /// lifetime is at most [`super::CONTEXT_TTL`], it was issued no later
    /// than the allowed skew and it has not expired at `now`. The caller
    /// checks the audience.
    pub fn verify(&self, header: &str, now: SystemTime) -> Result<TenantContext, ContextError> {
        let ctx = self.statement(header)?;
        let now = millis(now);
        if now > ctx.expires_ms || ctx.issued_ms > now + SKEW_MS {
            return Err(ContextError::Expired);
        }
        Ok(ctx)
    }

    /// The statement in `header` if one of these keys signed it and its
    /// lifetime is at most [`super::CONTEXT_TTL`], at any time: what the
    /// control plane checks a usage report's call against, minutes later.
    pub fn statement(&self, header: &str) -> Result<TenantContext, ContextError> {
        if header.len() > MAX_HEADER {
            return Err(ContextError::Invalid);
        }
        let (signed, sig) = header.rsplit_once('.').ok_or(ContextError::Invalid)?;
        let mut parts = signed.splitn(3, '.');
        let (Some(FORM), Some(kid), Some(payload)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(ContextError::Invalid);
        };
        let public = self
            .keys
            .iter()
            .find(|(k, _)| k == kid)
            .map(|(_, key)| key)
            .ok_or(ContextError::Invalid)?;
        let sig = B64.decode(sig).map_err(|_| ContextError::Invalid)?;
        UnparsedPublicKey::new(&ED25519, public)
            .verify(signed.as_bytes(), &sig)
            .map_err(|_| ContextError::Invalid)?;
        let json = B64.decode(payload).map_err(|_| ContextError::Invalid)?;
        let ctx: TenantContext =
            serde_json::from_slice(&json).map_err(|_| ContextError::Invalid)?;
        // A statement longer-lived than any gateway signs is not one.
        let lifetime = ctx.expires_ms.checked_sub(ctx.issued_ms);
        if lifetime.is_none_or(|l| l > super::CONTEXT_TTL.as_millis() as u64) {
            return Err(ContextError::Invalid);
        }
        Ok(ctx)
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}
