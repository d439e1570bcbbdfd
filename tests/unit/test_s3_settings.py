from __future__ import annotations

import pytest

from ledger.storage.settings import S3Settings


def test_options_override_the_aws_environment():
    env = {
        "AWS_ACCESS_KEY_ID": "env-key",
        "AWS_SECRET_ACCESS_KEY": "env-secret",
        "AWS_ENDPOINT_URL": "http://env:9000",
        "AWS_DEFAULT_REGION": "eu-west-1",
    }
    from_env = S3Settings.resolve({}, env)
    assert (from_env.key, from_env.secret, from_env.endpoint_url, from_env.region) == (
        "env-key",
        "env-secret",
        "http://env:9000",
        "eu-west-1",
    )
    given = S3Settings.resolve({"aws_access_key_id": "k", "endpoint_url": "http://x:1"}, env)
    assert given.key == "k" and given.secret == "env-secret" and given.endpoint_url == "http://x:1"
    assert S3Settings.resolve({}, {"AWS_ENDPOINT_URL_S3": "http://s3only:1"}).endpoint_url == (
        "http://s3only:1"
    )


def test_s3fs_kwargs_and_duckdb_secret_agree():
    s = S3Settings.resolve(
        {"key": "k", "secret": "it's", "endpoint_url": "http://127.0.0.1:9000", "retries": 2}, {}
    )
    kwargs = s.s3fs_kwargs()
    assert kwargs["key"] == "k" and kwargs["endpoint_url"] == "http://127.0.0.1:9000"
    assert kwargs["client_kwargs"] == {"region_name": "us-east-1"}
    assert s.s3fs_retries == 2 and "retries" not in kwargs  # an attribute of s3fs, set after
    assert kwargs["use_listings_cache"] is False
    sql = s.duckdb_secret_sql(scope="s3://bkt")
    assert "ENDPOINT '127.0.0.1:9000'" in sql and "USE_SSL false" in sql
    assert "SECRET 'it''s'" in sql and "URL_STYLE 'path'" in sql and "SCOPE 's3://bkt'" in sql
    https = S3Settings.resolve({"endpoint_url": "https://minio.example:9000"}, {})
    assert "USE_SSL true" in https.duckdb_secret_sql()
    # By default s3fs tries once: the ledger's RetryPolicy is the retry layer.
    assert https.s3fs_retries == 1


def test_bad_url_style_is_refused():
    with pytest.raises(ValueError, match="url_style"):
        S3Settings.resolve({"url_style": "sideways"}, {})
