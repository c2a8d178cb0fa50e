//! The database: one sqlx `Any` pool over SQLite (the embedded default) or
//! PostgreSQL, with the dialect's migrations from `migrations/` applied at
//! connect. Queries live in [`crate::store`] and are written once, in the SQL
//! both dialects accept (`$n` placeholders, integer booleans, epoch-ms times).

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{Any, AnyPool, Transaction};
use std::fmt;

/// Which database a [`Db`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Embedded SQLite file.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "PostgreSQL",
        })
    }
}

/// Why the database could not be opened or queried.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The URL names neither SQLite nor PostgreSQL.
    #[error("unsupported database URL `{0}`: use sqlite://PATH or postgres://…")]
    UnsupportedUrl(String),
    /// Opening the connection failed.
    #[error("cannot open the {backend} database {url}: {source}")]
    Connect {
        /// Which dialect.
        backend: Backend,
        /// The URL without its password.
        url: String,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// A migration failed.
    #[error("migrating the {backend} database: {source}")]
    Migrate {
        /// Which dialect.
        backend: Backend,
        /// The migrator's error.
        source: sqlx::migrate::MigrateError,
    },
    /// A query failed.
    #[error("database query failed: {0}")]
    Query(#[from] sqlx::Error),
}

/// The control plane's database handle; cheap to clone.
#[derive(Debug, Clone)]
pub struct Db {
    pool: AnyPool,
    backend: Backend,
}

impl Db {
    /// Opens `url` (`sqlite://PATH?mode=rwc` or `postgres://…`) and applies
    /// the dialect's pending migrations.
    pub async fn connect(url: &str) -> Result<Db, DbError> {
        install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else {
            return Err(DbError::UnsupportedUrl(redact(url)));
        };
        // SQLite serialises writers anyway; one connection avoids SQLITE_BUSY
        // on read-to-write upgrades inside transactions.
        let max = match backend {
            Backend::Sqlite => 1,
            Backend::Postgres => 8,
        };
        let pool = AnyPoolOptions::new()
            .max_connections(max)
            .connect(url)
            .await
            .map_err(|source| DbError::Connect {
                backend,
                url: redact(url),
                source,
            })?;
        let migrated = match backend {
            Backend::Sqlite => sqlx::migrate!("../migrations/sqlite").run(&pool).await,
            Backend::Postgres => sqlx::migrate!("../migrations/postgres").run(&pool).await,
        };
        migrated.map_err(|source| DbError::Migrate { backend, source })?;
        Ok(Db { pool, backend })
    }

    /// The `sqlite://` URL of a database file, created if missing.
    pub fn sqlite_url(path: &std::path::Path) -> String {
        format!("sqlite://{}?mode=rwc", path.display())
    }

    /// Which dialect.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Starts a transaction; the caller commits it.
    pub async fn begin(&self) -> Result<Transaction<'static, Any>, DbError> {
        Ok(self.pool.begin().await?)
    }

    /// The pool, for reads outside a transaction.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// `url` without its query (which may carry `password=`) and with any
/// password in the user info replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let url = url.split_once('?').map_or(url, |(base, _)| base);
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            super::redact("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(super::redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(super::redact("sqlite://x.db?mode=rwc"), "sqlite://x.db");
        assert_eq!(
            super::redact("postgres://u:p@ss@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(
            super::redact("postgres://h/db?user=u&password=s"),
            "postgres://h/db"
        );
    }
}
