"""URLs: recognised, joined, expanded as WebDataset writes shard ranges, and named in messages
without their credentials."""

from __future__ import annotations

import pytest

from fastpipe.data.remote.urls import (
    basename,
    entry_key,
    expand_braces,
    is_url,
    join,
    local_path_of,
    parent,
    protocol,
    redact,
)


def test_what_is_a_url():
    assert is_url("s3://bucket/key") and is_url("https://host/x") and is_url("hf://datasets/a")
    assert not is_url("file:///tmp/x") and not is_url("/tmp/x") and not is_url("C:\\data")
    assert not is_url(b"s3://x") and not is_url(None)
    assert protocol("S3://bucket/x") == "s3"
    assert local_path_of("file:///tmp/x.tar") == "/tmp/x.tar"
    with pytest.raises(ValueError, match="not a URL"):
        protocol("/tmp/x")


def test_credentials_never_in_what_messages_show():
    url = ("https://alice:hunter2pass@host:8443/d/x.tar?X-Amz-Signature=deadbeef"
           "&X-Amz-Credential=AKIAXX&version=3&sig=s3cr3t")
    shown = redact(url)
    for secret in ("alice", "hunter2pass", "deadbeef", "AKIAXX", "s3cr3t"):
        assert secret not in shown
    assert "host:8443/d/x.tar" in shown and "version=3" in shown


def test_the_entry_key_is_the_object_not_its_signature():
    a = entry_key("https://host/x.tar?X-Amz-Signature=1&X-Amz-Expires=60")
    b = entry_key("https://host/x.tar?X-Amz-Signature=2&X-Amz-Expires=90")
    assert a == b == entry_key("https://user:pw@host/x.tar")
    assert entry_key("s3://b/x.tar", "http://one:9000") != entry_key("s3://b/x.tar",
                                                                     "http://two:9000")
    assert entry_key("https://host/x.tar?part=1") != entry_key("https://host/x.tar?part=2")


def test_names_and_folders():
    assert basename("s3://b/train/shard%20000.tar?x=1") == "shard 000.tar"
    assert basename("s3://b/.hidden") == "hidden"  # never one of the cache's dot files
    assert join("s3://b/train/", "cat/1.jpg") == "s3://b/train/cat/1.jpg"
    assert join("s3://b/train/", "../val/1.jpg") == "s3://b/val/1.jpg"
    assert join("s3://b/train/", "gs://other/1.jpg") == "gs://other/1.jpg"
    assert parent("s3://b/train/list.txt") == "s3://b/train/"


def test_brace_ranges_as_webdataset_writes_them():
    assert expand_braces("s3://b/x-{000..002}.tar") == [
        "s3://b/x-000.tar", "s3://b/x-001.tar", "s3://b/x-002.tar"]
    assert expand_braces("s3://b/{train,val}-{0..1}.tar") == [
        "s3://b/train-0.tar", "s3://b/train-1.tar", "s3://b/val-0.tar", "s3://b/val-1.tar"]
    assert expand_braces("s3://b/plain.tar") == ["s3://b/plain.tar"]
    with pytest.raises(ValueError, match="more than"):
        expand_braces("s3://b/x-{0..99999999}.tar")
