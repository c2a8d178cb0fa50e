//! Newtype ids of the control plane's rows. Raw integers and strings do not
//! cross module boundaries as ids.

use std::fmt;

macro_rules! int_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(i64);

        impl $name {
            /// From the database's integer.
            pub fn from_db(raw: i64) -> Self {
                $name(raw)
            }

            /// The database's integer.
            pub fn get(self) -> i64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

int_id!(
    /// A model row.
    ModelId
);
int_id!(
    /// A registered worker.
    NodeId
);
int_id!(
    /// An incident.
    IncidentId
);
int_id!(
    /// An operator token.
    OperatorId
);

/// A config version of one model: 1, 2, …
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConfigVersion(u32);

impl ConfigVersion {
    /// The first version.
    pub const FIRST: ConfigVersion = ConfigVersion(1);

    /// From the wire or the database.
    pub fn new(raw: u32) -> Self {
        ConfigVersion(raw)
    }

    /// The number.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for ConfigVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// A tenant account id: 32 lowercase hex digits, as in Workers AI URLs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AccountId(String);

impl AccountId {
    /// A fresh random id.
    pub fn random() -> Result<AccountId, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        Ok(AccountId(hex(&bytes)))
    }

    /// Validates untrusted text.
    pub fn parse(s: &str) -> Option<AccountId> {
        (s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then(|| AccountId(s.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lowercase hex of bytes.
pub(crate) fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}
