"""Downloads checked against the checksum the store states for the object (S3's CRC-32 of the
whole object, Cloud Storage's CRC-32C), against moto's S3 server through a proxy that damages,
cuts short and counts: one GET per object, asked for the listed version; a damaged transfer
downloaded again and named when it stays damaged; a GET cut short resumed from where it stopped,
the whole still checked."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from fastpipe.data import RemoteError, ShardCache
from fastpipe.data.remote.checksums import Checksum, Hasher, cheapest, computable, stated_by_s3

SIZE = 40_000


@pytest.fixture(scope="module")
def objects(moto_server, tmp_path_factory):
    return moto_server.upload_random(tmp_path_factory.mktemp("sums"), "sumtest",
                                     {f"sum-{k}.bin": SIZE + k for k in range(3)}, seed=11)


@pytest.fixture
def proxied(moto_server, fault_proxy, cache_dir):
    proxy = fault_proxy(moto_server.endpoint)
    return proxy, moto_server.options(proxy.url, cache_dir=cache_dir, chunk_size=8192,
                                      backoff=0.01, retries=2)


def _stated(moto_server, url: str) -> dict:
    bucket, key = url.split("://", 1)[1].split("/", 1)
    return moto_server.client().head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")


def _recorded(cache: ShardCache, url: str) -> list:
    return json.loads(Path(cache.entry(url).meta).read_text())["checksum"]


def test_the_crc32_computed_is_the_one_s3_states(objects, moto_server):
    for url, data in objects.items():
        stated = stated_by_s3(_stated(moto_server, url))
        hasher = Hasher("crc32")
        for k in range(0, len(data), 5000):  # in pieces, as a download gives them
            hasher.update(data[k:k + 5000])
        assert stated == [hasher.checksum()]
        assert base64.b64decode(stated[0].value) == zlib.crc32(data).to_bytes(4, "big")


@pytest.mark.skipif(not computable("crc32c"), reason="google-crc32c (its C build) is missing")
def test_crc32c_is_castagnoli_s():
    hasher = Hasher("crc32c")
    hasher.update(b"1234")
    hasher.update(b"56789")
    assert hasher.checksum() == Checksum("crc32c", base64.b64encode(
        (0xE3069283).to_bytes(4, "big")).decode())  # the CRC-32C check value


@pytest.mark.skipif(not computable("crc64nvme"), reason="awscrt (0.23 or later) is missing")
def test_crc64nvme_is_nvme_s():
    hasher = Hasher("crc64nvme")
    hasher.update(b"1234")
    hasher.update(b"56789")
    assert hasher.checksum() == Checksum("crc64nvme", base64.b64encode(
        (0xAE8B14860A799888).to_bytes(8, "big")).decode())  # the CRC-64/NVME check value


def test_only_a_checksum_of_the_whole_object_is_used():
    crc = {"ChecksumCRC32": "AAAAAA=="}
    assert stated_by_s3({**crc, "ETag": '"abc"'}) == [Checksum("crc32", "AAAAAA==")]
    assert stated_by_s3({**crc, "ETag": '"abc"', "ChecksumType": "FULL_OBJECT"})
    assert stated_by_s3({**crc, "ETag": '"abc-3"', "ChecksumType": "FULL_OBJECT"})
    assert not stated_by_s3({**crc, "ETag": '"abc"', "ChecksumType": "COMPOSITE"})
    assert not stated_by_s3({**crc, "ETag": '"abc-3"'})  # a multipart upload, type not said
    assert not stated_by_s3({"ChecksumCRC32": "AAAAAA==-3", "ETag": '"abc"'})
    # The cheapest fastpipe computes, whatever the order stated.
    md5 = Checksum("md5", "0" * 32)
    assert cheapest([md5, Checksum("crc32", "x")]) == Checksum("crc32", "x")
    assert cheapest([md5, Checksum("sha256", "x")]) == md5
    assert cheapest([Checksum("sha256", "x")]) is None


def test_a_download_is_one_get_checked_against_the_crc_s3_states(objects, moto_server,
                                                                 proxied):
    proxy, options = proxied
    cache = ShardCache(options)
    url, data = next(iter(objects.items()))
    assert Path(cache.local_path(url)).read_bytes() == data
    name = url.rsplit("/", 1)[1]
    assert proxy.ranges(name) == [None]  # the whole object, read in chunks of 8 KiB
    crc = _stated(moto_server, url)["ChecksumCRC32"]
    assert _recorded(cache, url) == ["crc32", crc]  # not an MD5: a seventh of its cost
    # check="content" confirms the cached file against it.
    path = cache.local_path(url)
    assert ShardCache(replace(options, check="content")).local_path(url) == path
    assert proxy.ranges(name) == [None]


def test_an_object_stated_no_checksum_is_checked_against_its_etag_s_md5(moto_server, tmp_path,
                                                                       proxied):
    proxy, options = proxied
    [(url, data)] = moto_server.upload_random(tmp_path, "no-sums", {"plain.bin": SIZE},
                                              seed=2, checksum=None).items()
    assert not stated_by_s3(_stated(moto_server, url))
    cache = ShardCache(options)
    proxy.corrupt("plain.bin")  # caught by the MD5 alone: downloaded again
    assert Path(cache.local_path(url)).read_bytes() == data
    assert _recorded(cache, url) == ["md5", hashlib.md5(data).hexdigest()]
    assert proxy.ranges("plain.bin") == [None, None]


def test_a_damaged_transfer_is_downloaded_again(objects, moto_server, proxied):
    proxy, options = proxied
    cache = ShardCache(options)
    url, data = list(objects.items())[1]
    name = url.rsplit("/", 1)[1]
    proxy.corrupt(name)
    assert Path(cache.local_path(url)).read_bytes() == data
    # botocore's check of the whole body failed at its end (retried: the last chunk again),
    # then fastpipe's CRC of the whole (downloaded again).
    assert proxy.ranges(name) == [None, f"bytes={4 * 8192}-", None]
    assert _recorded(cache, url) == ["crc32", _stated(moto_server, url)["ChecksumCRC32"]]


def test_a_transfer_that_stays_damaged_is_named(objects, proxied):
    proxy, options = proxied
    cache = ShardCache(options)
    url = list(objects)[2]
    name = url.rsplit("/", 1)[1]
    proxy.corrupt(name, count=100)
    with pytest.raises(RemoteError, match=f"{name}: .*(checksum|Checksum)"):
        cache.local_path(url)
    assert not cache.holds(url) and not Path(cache.path_of(url)).exists()


def test_a_get_cut_short_resumes_where_it_stopped_and_the_whole_is_checked(moto_server,
                                                                         proxied):
    proxy, options = proxied
    options = replace(options, chunk_size=1 << 16)
    data = random.Random(3).randbytes(2 << 20)
    client = moto_server.client()
    client.create_bucket(Bucket="cut-short")
    client.put_object(Bucket="cut-short", Key="big.bin", Body=data)
    url = "s3://cut-short/big.bin"
    cache = ShardCache(options)
    proxy.truncate("big.bin", 1 << 20)  # each answer: its first MB
    assert Path(cache.local_path(url)).read_bytes() == data
    ranges = proxy.ranges("big.bin")
    # Then from where the data read stopped (what the connection had buffered is asked again).
    assert ranges[0] is None and None not in ranges[1:], ranges
    starts = [int(r[len("bytes="):-1]) for r in ranges[1:]]
    assert ranges[0] is None and ranges[1:] == [f"bytes={n}-" for n in starts]
    assert 0 < starts[0] <= 1 << 20 and starts == sorted(starts) and len(starts) <= 3
    assert all(n % (1 << 16) == 0 for n in starts)
    assert _recorded(cache, url) == ["crc32", _stated(moto_server, url)["ChecksumCRC32"]]


@pytest.mark.parametrize("newer", [b"a newer version, longer", b"the other version!"])
def test_an_object_rewritten_after_its_listing_is_never_read_as_the_listed_one(
        moto_server, cache_dir, newer):
    # The second version has the listed one's size: only the version asked for (If-Match)
    # tells them apart, its bytes matching the CRC the store states for them.
    client = moto_server.client()
    client.create_bucket(Bucket="rewrite-sums")
    client.put_object(Bucket="rewrite-sums", Key="x.bin", Body=b"the listed version")
    cache = ShardCache(moto_server.options(cache_dir=cache_dir, backoff=0.01))
    cache.info_of("s3://rewrite-sums/x.bin")
    client.put_object(Bucket="rewrite-sums", Key="x.bin", Body=newer)
    with pytest.raises(RemoteError, match="changed while it was listed and downloaded"):
        cache.local_path("s3://rewrite-sums/x.bin")
    assert not Path(cache.path_of("s3://rewrite-sums/x.bin")).exists()


def test_cloud_storage_downloads_are_checked_against_its_crc32c(gcs_server, tmp_path,
                                                                cache_dir):
    if not computable("crc32c"):
        pytest.skip("google-crc32c (its C build) is missing")
    data = bytes(range(256)) * 300
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "c.bin").write_bytes(data)
    [url] = gcs_server.upload(tmp_path / "up", "sums-gcs")
    cache = ShardCache(gcs_server.options(cache_dir=cache_dir))
    assert Path(cache.local_path(url)).read_bytes() == data
    hasher = Hasher("crc32c")
    hasher.update(data)
    assert _recorded(cache, url) == ["crc32c", hasher.checksum().value]


def test_a_read_s3fs_finds_damaged_against_the_stated_crc_is_retried(objects, proxied):
    # A read of a whole object through s3fs (botocore checks its body against the CRC-32 S3
    # states, and raises FlexibleChecksumError): a damaged transfer, which may pass.
    from fastpipe.data.remote.filesystems import head

    proxy, options = proxied
    url, data = next(iter(objects.items()))
    name = url.rsplit("/", 1)[1]
    proxy.corrupt(name)
    assert head(url, len(data), options) == data
    assert proxy.gets(name) == 2


def test_a_multipart_upload_is_read_whole_and_recorded_by_its_own_crc(moto_server, tmp_path,
                                                                      proxied):
    # Its ETag is no MD5 and its stated CRC-32 is of its parts' (a composite one): the bytes
    # are checked for size and version (If-Match), and a CRC-32 of them recorded for
    # check="content".
    proxy, options = proxied
    options = replace(options, chunk_size=1 << 20)
    data = random.Random(5).randbytes(12 << 20)
    (tmp_path / "multi.bin").write_bytes(data)
    client = moto_server.client()
    client.create_bucket(Bucket="multipart")
    client.upload_file(str(tmp_path / "multi.bin"), "multipart", "multi.bin")
    url = "s3://multipart/multi.bin"
    assert "-" in _stated(moto_server, url)["ETag"] and not stated_by_s3(_stated(moto_server, url))
    cache = ShardCache(options)
    assert Path(cache.local_path(url)).read_bytes() == data
    assert proxy.ranges("multi.bin") == [None]
    assert _recorded(cache, url) == [
        "crc32", base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()]


def test_an_answer_of_another_version_is_refused_where_the_store_ignores_if_match(
        moto_server, fault_proxy, cache_dir):
    proxy = fault_proxy(moto_server.endpoint)
    proxy.strip_header("If-Match")
    client = moto_server.client()
    client.create_bucket(Bucket="no-if-match")
    client.put_object(Bucket="no-if-match", Key="x.bin", Body=b"the listed version")
    cache = ShardCache(moto_server.options(proxy.url, cache_dir=cache_dir, backoff=0.01))
    cache.info_of("s3://no-if-match/x.bin")
    client.put_object(Bucket="no-if-match", Key="x.bin", Body=b"the other version!")
    with pytest.raises(RemoteError, match="changed while it was listed and downloaded"):
        cache.local_path("s3://no-if-match/x.bin")
    assert not Path(cache.path_of("s3://no-if-match/x.bin")).exists()


def test_an_entry_without_a_recorded_checksum_is_not_taken_as_confirmed(objects, proxied):
    # As an older fastpipe wrote them (an "md5" key): check="content" downloads it again.
    proxy, options = proxied
    url, data = next(iter(objects.items()))
    cache = ShardCache(options)
    path = cache.local_path(url)
    meta = Path(cache.entry(url).meta)
    recorded = json.loads(meta.read_text())
    recorded["md5"] = hashlib.md5(data).hexdigest()
    del recorded["checksum"]
    meta.write_text(json.dumps(recorded))
    assert ShardCache(options).local_path(url) == path  # check="stat": as it is
    assert proxy.gets(url.rsplit("/", 1)[1]) == 1
    assert Path(ShardCache(replace(options, check="content")).local_path(url)).read_bytes() == data
    assert proxy.gets(url.rsplit("/", 1)[1]) == 2


def test_cloud_storage_md5_is_no_etag(gcs_server, fault_proxy, tmp_path, cache_dir,
                                      monkeypatch):
    # Without google-crc32c, Cloud Storage's md5Hash is the check: two downloads damaged alike
    # are refused (an S3 ETag that is no MD5 of the bytes is the one case they are taken).
    from fastpipe.data.remote import checksums

    monkeypatch.setattr(checksums, "_crc32c", lambda: None)
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "m.bin").write_bytes(bytes(range(256)) * 100)
    [url] = gcs_server.upload(tmp_path / "up", "md5-gcs")
    proxy = fault_proxy(gcs_server.endpoint)
    proxy.corrupt(r"^/download/.*m\.bin", count=100)  # its bytes, not its metadata
    cache = ShardCache(gcs_server.options(proxy.url, cache_dir=cache_dir, backoff=0.01))
    with pytest.raises(RemoteError, match="do not match the md5 checksum"):
        cache.local_path(url)


@pytest.mark.parametrize("etag", [True, False])
def test_two_equal_downloads_unlike_an_etag_s_md5_are_the_object(objects, proxied, monkeypatch,
                                                                 etag):
    # An object encrypted with KMS has an ETag that is no MD5 of its bytes; the download is
    # taken where two agree. A checksum computed of the bytes (etag=False) must match.
    from fastpipe.data.remote import cache as cache_module
    from fastpipe.data.remote.download import Downloaded

    proxy, options = proxied
    url, data = list(objects.items())[1]
    real = cache_module.download

    def unlike_its_etag(info, path, opts, stop=None):
        got = real(info, path, opts, stop)
        return Downloaded(got.checksum, Checksum("md5", "0" * 32, etag=etag), True)

    monkeypatch.setattr(cache_module, "download", unlike_its_etag)
    cache = ShardCache(options)
    if etag:
        assert Path(cache.local_path(url)).read_bytes() == data
    else:
        with pytest.raises(RemoteError, match="do not match the md5 checksum"):
            cache.local_path(url)
    assert proxy.gets(url.rsplit("/", 1)[1]) == 2


@pytest.mark.parametrize("encryption", ["aws:kms", "aws:kms:dsse", "AES256"])
def test_the_etag_of_an_object_encrypted_with_a_key_is_not_taken_for_its_md5(
        moto_server, tmp_path, proxied, monkeypatch, encryption):
    # S3 gives an object encrypted with KMS (or a customer's key) an ETag that is not the MD5 of
    # its bytes; moto gives every object its MD5. Listed with an ETag unlike its MD5, as S3
    # lists it: a KMS object (stated no CRC) is one download with a CRC-32 of fastpipe's own;
    # one encrypted by S3's own key (whose ETag is its MD5) is still checked against the ETag.
    from fastpipe.data.remote import filesystems

    real = filesystems._etag

    def unlike_its_md5(found):
        etag, checksums = real(found)
        return etag, tuple(Checksum("md5", "0" * 32, etag=True) if c.etag else c
                           for c in checksums)

    monkeypatch.setattr(filesystems, "_etag", unlike_its_md5)
    proxy, options = proxied
    data = random.Random(5).randbytes(SIZE)
    client = moto_server.client(checksums=False)
    client.create_bucket(Bucket="encrypted")
    client.put_object(Bucket="encrypted", Key="e.bin", Body=data, ServerSideEncryption=encryption)
    url = "s3://encrypted/e.bin"
    cache = ShardCache(options)
    assert Path(cache.local_path(url)).read_bytes() == data
    if encryption.startswith("aws:kms"):
        assert proxy.ranges("e.bin") == [None]
        assert _recorded(cache, url) == ["crc32", base64.b64encode(
            zlib.crc32(data).to_bytes(4, "big")).decode()]
    else:  # checked against it, found unlike, downloaded again
        assert proxy.ranges("e.bin") == [None, None]


@pytest.mark.skipif(not computable("crc64nvme"), reason="awscrt (0.23 or later) is missing")
def test_a_download_is_checked_against_the_crc64nvme_s3_states(moto_server, tmp_path, proxied):
    # What S3 states for an object uploaded without a checksum of its own (since 2025), and for
    # multipart uploads: checked (an instruction's CRC) rather than the ETag's MD5, or nothing.
    proxy, options = proxied
    [(url, data)] = moto_server.upload_random(tmp_path, "nvme-sums", {"n.bin": SIZE}, seed=4,
                                              checksum="CRC64NVME").items()
    stated = stated_by_s3(_stated(moto_server, url))
    assert [c.algorithm for c in stated] == ["crc64nvme"]
    cache = ShardCache(options)
    proxy.corrupt("n.bin")
    assert Path(cache.local_path(url)).read_bytes() == data
    assert _recorded(cache, url) == ["crc64nvme", stated[0].value]
    # botocore's check failed at the body's end (the last chunk again), then fastpipe's.
    assert proxy.ranges("n.bin") == [None, f"bytes={4 * 8192}-", None]
