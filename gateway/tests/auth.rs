//! The authentication suite: API tokens and JWTs (HS256, RS256, EdDSA)
//! that must be accepted, and more than twenty that must be refused, each
//! with a 401 (403 for a valid token on another account's URL) in the
//! route's own error shape, never saying which check failed.

mod support;

use bulkhead_gateway::{JwtConfig, JwtKeys};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};
use support::{OPEN, bearer, call, get, platform};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-test-only";
const ISS: &str = "https://issuer.test";
const AUD: &str = "bulkhead";

fn key(file: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/keys/{file}", env!("CARGO_MANIFEST_DIR"))).expect("test key")
}

fn jwt_config() -> JwtConfig {
    let jwks = String::from_utf8(key("jwks.json")).expect("utf-8");
    let mut c =
        JwtConfig::new(Some(SECRET), JwtKeys::from_jwks(&jwks).expect("jwks")).expect("config");
    c.issuer = Some(ISS.to_owned());
    c.audience = Some(AUD.to_owned());
    c
}

fn now() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    )
    .unwrap_or(0)
}

fn claims(account: &str) -> Value {
    json!({"account_id": account, "iss": ISS, "aud": AUD, "exp": now() + 600, "nbf": now() - 10, "sub": "user-1"})
}

fn sign(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: &Value) -> String {
    let mut h = Header::new(alg);
    h.kid = kid.map(str::to_owned);
    encode(&h, claims, key).expect("sign")
}

fn rsa_key() -> EncodingKey {
    EncodingKey::from_rsa_pem(&key("rsa.pem")).expect("rsa")
}

fn ed_key() -> EncodingKey {
    EncodingKey::from_ed_pem(&key("ed.pem")).expect("ed")
}

fn hs(claims: &Value) -> String {
    let k = EncodingKey::from_secret(SECRET).expect("key");
    sign(Algorithm::HS256, None, &k, claims)
}

fn rs(claims: &Value) -> String {
    sign(Algorithm::RS256, Some("rsa-1"), &rsa_key(), claims)
}

fn ed(claims: &Value) -> String {
    sign(Algorithm::EdDSA, Some("ed-1"), &ed_key(), claims)
}

fn b64(v: &Value) -> String {
    // base64url without padding, by hand (no extra dependency for a test).
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = v.to_string().into_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n =
            chunk.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

#[tokio::test]
async fn good_credentials_are_accepted_and_more_than_twenty_bad_ones_refused() {
    let p = platform().await;
    let gw = p
        .gateway(Some(jwt_config()), support::Platform::limiter())
        .await;
    let models_a = format!("/client/v4/accounts/{}/ai/models/search", p.a);

    // Accepted: the account's API token, and JWTs of every configured kind.
    let good = [
        ("api token", bearer(&p.a_token)),
        (
            "api token, lowercase scheme",
            format!("bearer {}", p.a_token),
        ),
        ("HS256", bearer(&hs(&claims(&p.a)))),
        ("RS256", bearer(&rs(&claims(&p.a)))),
        ("EdDSA", bearer(&ed(&claims(&p.a)))),
    ];
    for (what, auth) in &good {
        let r = get(&gw, &models_a, auth).await;
        assert_eq!(r.status, 200, "{what}: {}", r.body);
        let r = get(&gw, "/v1/models", auth).await;
        assert_eq!(r.status, 200, "{what} on /v1: {}", r.body);
        assert!(r.body.contains(OPEN), "{what}: {}", r.body);
    }

    let rsa_other = EncodingKey::from_rsa_pem(&key("rsa_other.pem")).expect("rsa");
    let ed_other = EncodingKey::from_ed_pem(&key("ed_other.pem")).expect("ed");
    let mut c_expired = claims(&p.a);
    c_expired["exp"] = json!(now() - 3600);
    let mut c_future = claims(&p.a);
    c_future["nbf"] = json!(now() + 3600);
    let mut c_aud = claims(&p.a);
    c_aud["aud"] = json!("someone-else");
    let mut c_iss = claims(&p.a);
    c_iss["iss"] = json!("https://evil.test");
    let mut c_no_exp = claims(&p.a);
    c_no_exp.as_object_mut().map(|o| o.remove("exp"));
    let mut c_no_account = claims(&p.a);
    c_no_account.as_object_mut().map(|o| o.remove("account_id"));
    let c_unknown = claims(&"f".repeat(32));
    let valid_hs = hs(&claims(&p.a));
    let mut parts: Vec<String> = valid_hs.split('.').map(str::to_owned).collect();
    let tampered = {
        let mut c = claims(&p.b);
        c["sub"] = json!("admin");
        parts[1] = b64(&c);
        parts.join(".")
    };
    let alg_none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&claims(&p.a))
    );
    let alg_none_sig = format!(
        "{}.{}.{}",
        b64(&json!({"alg": "none"})),
        b64(&claims(&p.a)),
        parts[2]
    );
    // HS/RS confusion: an HS256 token whose "secret" is the RSA public key.
    let confused = sign(
        Algorithm::HS256,
        Some("rsa-1"),
        &EncodingKey::from_secret(&key("rsa_pub.pem")).expect("key"),
        &claims(&p.a),
    );
    let hs512 = sign(
        Algorithm::HS512,
        None,
        &EncodingKey::from_secret(SECRET).expect("key"),
        &claims(&p.a),
    );

    // (what, Authorization header, expected status) — all on account A's URL.
    let bad: Vec<(&str, Option<String>, u16)> = vec![
        ("no header", None, 401),
        ("empty bearer", Some("Bearer ".to_owned()), 401),
        ("no scheme", Some(p.a_token.clone()), 401),
        ("basic scheme", Some(format!("Basic {}", p.a_token)), 401),
        ("garbage", Some(bearer("not-a-token")), 401),
        ("non-ASCII", Some(bearer("bhk_ünïcode")), 401),
        (
            "unknown API token",
            Some(bearer(&format!("bhk_{}", "0".repeat(64)))),
            401,
        ),
        ("revoked API token", Some(bearer(&p.a_revoked)), 401),
        ("another account's API token", Some(bearer(&p.b_token)), 403),
        ("alg none", Some(bearer(&alg_none)), 401),
        (
            "alg none with a signature",
            Some(bearer(&alg_none_sig)),
            401,
        ),
        (
            "HS256 wrong secret",
            Some(bearer(&sign(
                Algorithm::HS256,
                None,
                &EncodingKey::from_secret(b"another-secret-another-secret-000").expect("key"),
                &claims(&p.a),
            ))),
            401,
        ),
        ("HS/RS confusion", Some(bearer(&confused)), 401),
        (
            "RS256 wrong key",
            Some(bearer(&sign(
                Algorithm::RS256,
                Some("rsa-1"),
                &rsa_other,
                &claims(&p.a),
            ))),
            401,
        ),
        (
            "RS256 unknown kid",
            Some(bearer(&sign(
                Algorithm::RS256,
                Some("rsa-9"),
                &rsa_key(),
                &claims(&p.a),
            ))),
            401,
        ),
        (
            "EdDSA wrong key",
            Some(bearer(&sign(
                Algorithm::EdDSA,
                Some("ed-1"),
                &ed_other,
                &claims(&p.a),
            ))),
            401,
        ),
        (
            "RS kid with an Ed signature",
            Some(bearer(&sign(
                Algorithm::EdDSA,
                Some("rsa-1"),
                &ed_key(),
                &claims(&p.a),
            ))),
            401,
        ),
        ("HS512 not configured", Some(bearer(&hs512)), 401),
        ("expired", Some(bearer(&hs(&c_expired))), 401),
        ("not yet valid", Some(bearer(&hs(&c_future))), 401),
        ("wrong audience", Some(bearer(&hs(&c_aud))), 401),
        ("wrong issuer", Some(bearer(&hs(&c_iss))), 401),
        ("no exp", Some(bearer(&hs(&c_no_exp))), 401),
        ("no account claim", Some(bearer(&hs(&c_no_account))), 401),
        ("unknown account", Some(bearer(&hs(&c_unknown))), 401),
        (
            "another account's JWT",
            Some(bearer(&hs(&claims(&p.b)))),
            403,
        ),
        ("tampered payload", Some(bearer(&tampered)), 401),
        ("two-part JWT", Some(bearer(&parts[..2].join("."))), 401),
        (
            "header only",
            Some(bearer(&b64(&json!({"alg": "HS256"})))),
            401,
        ),
        ("oversized", Some(bearer(&"a".repeat(10_000))), 401),
    ];
    assert!(bad.len() >= 20);
    for (what, auth, expected) in &bad {
        // Workers AI route: the v4 envelope, code 10000.
        let r = call(&gw, "GET", &models_a, auth.as_deref(), None).await;
        assert_eq!(r.status.as_u16(), *expected, "{what}: {}", r.body);
        let v = r.json();
        assert_eq!(v["success"], false, "{what}");
        assert_eq!(v["result"], Value::Null, "{what}");
        assert_eq!(v["errors"][0]["code"], 10000, "{what}: {v}");
        // OpenAI route on A's account URL: OpenAI's shape.
        let r = call(
            &gw,
            "GET",
            &format!("/client/v4/accounts/{}/ai/v1/models", p.a),
            auth.as_deref(),
            None,
        )
        .await;
        assert_eq!(r.status.as_u16(), *expected, "{what} (OpenAI): {}", r.body);
        let v = r.json();
        let kind = if *expected == 401 {
            "authentication_error"
        } else {
            "permission_error"
        };
        assert_eq!(v["error"]["type"], kind, "{what}: {v}");
        // Refusals say nothing about which check failed, in either shape.
        let wa = call(&gw, "GET", &models_a, auth.as_deref(), None).await;
        for body in [&r.body, &wa.body] {
            for leak in [
                "expired",
                "signature",
                "audience",
                "issuer",
                "kid",
                "claim",
                "revoked",
                "algorithm",
            ] {
                assert!(
                    !body.to_lowercase().contains(leak),
                    "{what} leaks `{leak}`: {body}"
                );
            }
        }
    }
    // Algorithm confusion against a gateway that has only public keys: an
    // HS256 token "signed" with the RSA public key must not pass.
    let jwks = String::from_utf8(key("jwks.json")).expect("utf-8");
    let mut keys_only =
        JwtConfig::new(None, JwtKeys::from_jwks(&jwks).expect("jwks")).expect("config");
    keys_only.issuer = Some(ISS.to_owned());
    keys_only.audience = Some(AUD.to_owned());
    let pk = p
        .gateway(Some(keys_only), support::Platform::limiter())
        .await;
    let r = get(&pk, "/v1/models", &bearer(&confused)).await;
    assert_eq!(r.status, 401, "{}", r.body);
    let r = get(&pk, "/v1/models", &bearer(&rs(&claims(&p.a)))).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = get(&pk, "/v1/models", &bearer(&hs(&claims(&p.a)))).await;
    assert_eq!(r.status, 401, "no HS256 secret configured: {}", r.body);

    // Without any JWT configuration, JWTs are refused and API tokens work.
    let plain = p.gateway(None, support::Platform::limiter()).await;
    let r = get(&plain, "/v1/models", &bearer(&hs(&claims(&p.a)))).await;
    assert_eq!(r.status, 401);
    let r = get(&plain, "/v1/models", &bearer(&p.a_token)).await;
    assert_eq!(r.status, 200);
}
