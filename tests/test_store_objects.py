"""The store's storage seam (tracking/store/objects.py) on both of its places, a folder and an S3 bucket (moto's
server as its own process, or the lab's service named by RAGLEDGER_TEST_S3_URL): create-only puts never overwrite,
compare-and-swap refuses a stale tag, and bad S3 settings are one line naming the URL, never a credential."""

from __future__ import annotations

import time

import pytest

from tests.servers import S3Server, free_port
from tracking.store.objects import (
    ConflictError,
    FolderObjects,
    S3Location,
    S3Objects,
    StorageError,
    parse_s3_url,
)


@pytest.fixture(scope="module")
def s3():
    with S3Server() as server:
        yield server


@pytest.fixture
def s3_env(s3, monkeypatch):
    return s3.point(monkeypatch)


@pytest.fixture(params=["folder", "s3"])
def objects(request, tmp_path):
    if request.param == "folder":
        return FolderObjects(tmp_path / "store")
    s3 = request.getfixturevalue("s3_env")
    return S3Objects(parse_s3_url(s3.url("seam")))


def test_create_only_put_never_overwrites(objects):
    assert objects.put_new("outcomes/exp/seg-a.parquet", b"first")
    # a second create-only put of the same key is refused by the service (If-None-Match: *), not by a look first
    assert not objects.put_new("outcomes/exp/seg-a.parquet", b"second")
    assert objects.get("outcomes/exp/seg-a.parquet")[0] == b"first"


def test_compare_and_swap_refuses_a_stale_tag(objects):
    first = objects.put_if("compacted/exp.json", b'{"v": 1}', None)
    with pytest.raises(ConflictError):  # it exists: a writer that never read it may not create it
        objects.put_if("compacted/exp.json", b'{"v": 0}', None)
    second = objects.put_if("compacted/exp.json", b'{"v": 2}', first)
    assert second != first
    with pytest.raises(ConflictError):  # another writer committed since `first` was read
        objects.put_if("compacted/exp.json", b'{"v": 3}', first)
    assert objects.get("compacted/exp.json") == (b'{"v": 2}', second)


def test_get_list_delete(objects):
    assert objects.get("runs/exp/none.json") is None
    objects.put_new("outcomes/exp/seg-a.parquet", b"a")
    objects.put_new("outcomes/other/seg-b.parquet", b"b")
    objects.put_if("runs/exp/1.json", b"{}", None)
    assert sorted(objects.list()) == ["outcomes/exp/seg-a.parquet", "outcomes/other/seg-b.parquet", "runs/exp/1.json"]
    assert sorted(objects.list("outcomes/exp/")) == ["outcomes/exp/seg-a.parquet"]
    assert objects.list()["runs/exp/1.json"] == objects.get("runs/exp/1.json")[1]
    objects.delete("outcomes/exp/seg-a.parquet")
    objects.delete("outcomes/exp/seg-a.parquet")  # gone already: still fine
    assert sorted(objects.list("outcomes/")) == ["outcomes/other/seg-b.parquet"]


def test_s3_url_needs_a_bucket_and_no_credentials():
    assert parse_s3_url("s3://bucket/a/b/") == S3Location("bucket", "a/b")
    assert parse_s3_url("s3://bucket") == S3Location("bucket", "")
    with pytest.raises(StorageError, match=r"^--store s3://: no bucket \(s3://BUCKET/PREFIX\)$"):
        parse_s3_url("s3://")
    with pytest.raises(StorageError, match="credentials or a port do not belong in the URL") as exc:
        parse_s3_url("s3://key:hunter2@bucket/p")
    assert "hunter2" not in str(exc.value)


def test_unreachable_endpoint_fails_in_bounded_time(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "never-shown-secret")
    started = time.monotonic()
    with pytest.raises(StorageError) as exc:
        S3Objects(parse_s3_url("s3://bucket/p")).check()
    assert time.monotonic() - started < 30
    assert str(exc.value).startswith("--store s3://bucket/p: cannot reach the S3 endpoint http://127.0.0.1:")
    assert "never-shown-secret" not in str(exc.value)


def test_missing_bucket_is_named(s3_env):
    with pytest.raises(StorageError, match=r"^--store s3://no-such-bucket-here/p: no bucket 'no-such-bucket-here' at "):
        S3Objects(parse_s3_url("s3://no-such-bucket-here/p")).check()


def test_wrong_credentials_are_refused_without_showing_them(monkeypatch):
    if S3Server().lab:
        pytest.skip("a lab's service: its own credentials decide; wrong ones are shown refused on moto")
    # moto checks credentials once its first requests are done (INITIAL_NO_AUTH_ACTION_COUNT): here, from the first
    with S3Server(no_auth_actions=0) as server:
        for name, value in {**server.env, "AWS_SECRET_ACCESS_KEY": "wrong-secret-xyz"}.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(StorageError) as exc:
            S3Objects(parse_s3_url("s3://ragledger-test/p")).check()
    message = str(exc.value)
    assert message.startswith("--store s3://ragledger-test/p: the S3 service at http://127.0.0.1:")
    assert "refused the credentials" in message
    assert "wrong-secret-xyz" not in message and "ragledger-test-key" not in message


def test_a_key_that_may_only_read_is_told_before_anything_is_written(monkeypatch):
    """moto enforcing IAM once the bucket and two users are made: the write check passes for a key that may write
    and refuses one that may only read (which still lists), and writes nothing either way."""
    if S3Server().lab:
        pytest.skip("a lab's service: its own policies decide; a read-only key is shown refused on moto")
    with S3Server(no_auth_actions=7) as server:  # the bucket, then 3 requests per user, without credentials
        server.client().create_bucket(Bucket=server.bucket)
        users = server.iam_users({"writer": ["s3:*"], "reader": ["s3:GetObject", "s3:ListBucket"]})
        url = server.url("rw")
        for name, value in users["writer"].items():
            monkeypatch.setenv(name, value)
        S3Objects(parse_s3_url(url)).check_writable()
        server.env = users["writer"]  # the test's own listing
        for name, value in users["reader"].items():
            monkeypatch.setenv(name, value)
        reader = S3Objects(parse_s3_url(url))
        reader.check()
        with pytest.raises(StorageError) as exc:
            reader.check_writable()
        assert server.keys(url) == []
    assert str(exc.value) == (f"--store {url}: the credentials in AWS_ACCESS_KEY_ID may read this store but not write "
                              "to it (AccessDenied); this command writes")
