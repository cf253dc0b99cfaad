#!/usr/bin/python3
"""The S3 gateway (`alignfs s3`) against S3 clients nobody here wrote: boto3 (buckets,
objects, ranges, listings against a model, copies, metadata, multipart, the errors S3
defines), awscli, s3cmd and rclone (copy up, list, copy back, compare), the same clients over
HTTPS with a test CA (and the clients HTTPS must refuse), then a kill -9
loop: a boto3 writer PUTs objects and multipart uploads while the gateway is killed at
random moments; after each restart every acknowledged object reads back with its MD5, and
an interrupted multipart upload is absent or listed as incomplete (then aborted).

usage: run.py ALIGNFS_BINARY WORK_DIR [--kill-rounds N]
Ends with "suite totals: N passed, N failed".
"""

import argparse
import hashlib
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import traceback

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

ACCESS, SECRET = "alignfs-test", "not-a-real-secret-0123"
passed = failed = 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    def __init__(self, binary, work, extra=(), ca=None):
        self.binary, self.work, self.extra = binary, work, list(extra)
        self.port = free_port()
        self.proc = None
        # HTTPS when a CA bundle is given (the gateway then runs with --tls-cert/--tls-key).
        self.ca = ca

    def start(self):
        log = open(os.path.join(self.work, "s3.log"), "a")
        self.proc = subprocess.Popen(
            [self.binary, "s3", "--ssd", os.path.join(self.work, "ssd.img"), "--keys", os.path.join(self.work, "keys"),
             "--listen", f"127.0.0.1:{self.port}", *self.extra],
            stdout=log, stderr=log)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with {self.proc.returncode}; see {self.work}/s3.log")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the gateway did not start listening")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        if code != 0:
            raise RuntimeError(f"the gateway exited with {code} at SIGTERM")

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def endpoint(self):
        return f"https://localhost:{self.port}" if self.ca else f"http://127.0.0.1:{self.port}"

    def client(self, secret=SECRET, access=ACCESS, verify=None):
        return boto3.client("s3", endpoint_url=self.endpoint(), aws_access_key_id=access, aws_secret_access_key=secret,
                            region_name="us-east-1", verify=verify if verify is not None else self.ca,
                            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))


def check(name, fn):
    global passed, failed
    try:
        fn()
        passed += 1
        print(f"ok   {name}")
    except Exception:
        failed += 1
        print(f"FAIL {name}")
        traceback.print_exc()


def error_code(fn):
    try:
        fn()
    except ClientError as e:
        return e.response["Error"]["Code"]
    return None


def expect_error(code, fn):
    got = error_code(fn)
    assert got == code, f"expected {code}, got {got}"


def format_store(binary, work):
    subprocess.run([binary, "mkfs", "--profile", "nvstore", "--force", "--ssd", os.path.join(work, "ssd.img:512M")],
                   check=True, stdout=subprocess.DEVNULL)
    keys = os.path.join(work, "keys")
    with open(keys, "w") as f:
        f.write(f"# test keys\n{ACCESS} {SECRET}\n")
    os.chmod(keys, 0o600)


# --- boto3 -----------------------------------------------------------------------------

def boto3_suite(gw):
    s3 = gw.client()
    s3.create_bucket(Bucket="alpha")
    s3.create_bucket(Bucket="beta")
    rng = random.Random(7)

    def buckets():
        names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
        assert names == ["alpha", "beta"], names
        expect_error("BucketAlreadyOwnedByYou", lambda: s3.create_bucket(Bucket="alpha"))
        expect_error("NoSuchBucket", lambda: s3.put_object(Bucket="gamma", Key="k", Body=b"x"))
        expect_error("InvalidBucketName", lambda: s3.create_bucket(Bucket="No_Such"))
        s3.head_bucket(Bucket="alpha")
    check("boto3: buckets", buckets)

    def objects():
        data = rng.randbytes(300_001)
        r = s3.put_object(Bucket="alpha", Key="dir/a.bin", Body=data, Metadata={"Color": "blue"},
                          ContentType="application/x-test", CacheControl="no-cache")
        assert r["ETag"] == f'"{hashlib.md5(data).hexdigest()}"', r["ETag"]
        g = s3.get_object(Bucket="alpha", Key="dir/a.bin")
        assert g["Body"].read() == data
        assert g["Metadata"] == {"color": "blue"} and g["ContentType"] == "application/x-test", g
        assert g["CacheControl"] == "no-cache" and g["ContentLength"] == len(data)
        for first, last in [(0, 0), (4095, 4096), (100, 299_999), (300_000, 300_000)]:
            part = s3.get_object(Bucket="alpha", Key="dir/a.bin", Range=f"bytes={first}-{last}")
            assert part["Body"].read() == data[first:last + 1], (first, last)
            assert part["ContentRange"] == f"bytes {first}-{last}/{len(data)}"
        tail = s3.get_object(Bucket="alpha", Key="dir/a.bin", Range="bytes=-10")["Body"].read()
        assert tail == data[-10:]
        expect_error("InvalidRange", lambda: s3.get_object(Bucket="alpha", Key="dir/a.bin", Range="bytes=400000-"))
        h = s3.head_object(Bucket="alpha", Key="dir/a.bin")
        assert h["ContentLength"] == len(data) and h["Metadata"] == {"color": "blue"}
        s3.put_object(Bucket="alpha", Key="empty", Body=b"")
        assert s3.get_object(Bucket="alpha", Key="empty")["Body"].read() == b""
        expect_error("NoSuchKey", lambda: s3.get_object(Bucket="alpha", Key="missing"))
        expect_error("404", lambda: s3.head_object(Bucket="alpha", Key="missing"))
        s3.delete_object(Bucket="alpha", Key="missing")  # S3: success
        s3.delete_object(Bucket="alpha", Key="empty")
        expect_error("NoSuchKey", lambda: s3.get_object(Bucket="alpha", Key="empty"))
        expect_error("KeyTooLongError", lambda: s3.put_object(Bucket="alpha", Key="k" * 300, Body=b"x"))
        etag = s3.head_object(Bucket="alpha", Key="dir/a.bin")["ETag"]
        expect_error("PreconditionFailed", lambda: s3.get_object(Bucket="alpha", Key="dir/a.bin", IfMatch='"0000"'))
        expect_error("304", lambda: s3.get_object(Bucket="alpha", Key="dir/a.bin", IfNoneMatch=etag))
    check("boto3: put, get, ranges, head, delete, conditions", objects)

    def digests():
        data = b"checked bytes" * 1000
        import base64
        good = base64.b64encode(hashlib.md5(data).digest()).decode()
        s3.put_object(Bucket="alpha", Key="md5", Body=data, ContentMD5=good)
        bad = base64.b64encode(hashlib.md5(b"other").digest()).decode()
        expect_error("BadDigest", lambda: s3.put_object(Bucket="alpha", Key="md5", Body=b"replacement", ContentMD5=bad))
        assert s3.get_object(Bucket="alpha", Key="md5")["Body"].read() == data, "a refused put changed the object"
        for algorithm in ["CRC32", "CRC32C", "SHA1", "SHA256"]:
            r = s3.put_object(Bucket="alpha", Key=f"sum-{algorithm}", Body=data, ChecksumAlgorithm=algorithm)
            assert r.get(f"Checksum{algorithm}"), (algorithm, r)
        sha = base64.b64encode(hashlib.sha256(b"different").digest()).decode()
        expect_error("BadDigest", lambda: s3.put_object(Bucket="alpha", Key="sha", Body=data, ChecksumSHA256=sha))
        expect_error("NoSuchKey", lambda: s3.get_object(Bucket="alpha", Key="sha"))
    check("boto3: Content-MD5 and checksums verified, a mismatch changes nothing", digests)

    def auth():
        wrong = gw.client(secret="wrong-secret-000000")
        expect_error("SignatureDoesNotMatch", lambda: wrong.list_buckets())
        unknown = gw.client(access="nobody")
        expect_error("InvalidAccessKeyId", lambda: unknown.list_buckets())
        import urllib.request
        try:
            urllib.request.urlopen(gw.endpoint() + "/alpha/dir/a.bin")
            raise AssertionError("an anonymous GET was served")
        except urllib.error.HTTPError as e:
            assert e.code == 403 and b"AccessDenied" in e.read(), e.code
    check("boto3: SigV4 keys from the key file; wrong and anonymous requests refused", auth)

    def listings():
        model = set()
        for i in range(300):
            key = rng.choice(["", "a/", "a/b/", "a.b/", "z/", "a/b/c/"]) + f"k{rng.randrange(60):02d}" + rng.choice(["", ".txt", "/x"])
            if key not in model:
                s3.put_object(Bucket="beta", Key=key, Body=key.encode())
                model.add(key)
        for prefix in ["", "a/", "a/b", "a.", "z/", "nothing"]:
            for delimiter in [None, "/"]:
                want_keys, want_prefixes = [], set()
                for k in sorted(model):
                    if not k.startswith(prefix):
                        continue
                    rest = k[len(prefix):]
                    if delimiter and delimiter in rest:
                        want_prefixes.add(prefix + rest[:rest.index(delimiter) + 1])
                    else:
                        want_keys.append(k)
                got_keys, got_prefixes, token = [], [], None
                while True:
                    args = dict(Bucket="beta", Prefix=prefix, MaxKeys=7)
                    if delimiter:
                        args["Delimiter"] = delimiter
                    if token:
                        args["ContinuationToken"] = token
                    page = s3.list_objects_v2(**args)
                    got_keys += [o["Key"] for o in page.get("Contents", [])]
                    got_prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
                    assert page["KeyCount"] <= 7
                    if not page["IsTruncated"]:
                        break
                    token = page["NextContinuationToken"]
                assert got_keys == want_keys, (prefix, delimiter, got_keys[:5], want_keys[:5])
                assert sorted(got_prefixes) == sorted(want_prefixes) and len(got_prefixes) == len(set(got_prefixes)), (prefix, delimiter)
        v1 = s3.get_paginator("list_objects").paginate(Bucket="beta", PaginationConfig={"PageSize": 11})
        assert [o["Key"] for page in v1 for o in page.get("Contents", [])] == sorted(model)
        v2 = s3.list_objects_v2(Bucket="beta", StartAfter=sorted(model)[10], MaxKeys=5)
        assert [o["Key"] for o in v2["Contents"]] == sorted(model)[11:16]
        expect_error("BucketNotEmpty", lambda: s3.delete_bucket(Bucket="beta"))
        keys = sorted(model)
        for i in range(0, len(keys), 100):
            r = s3.delete_objects(Bucket="beta", Delete={"Objects": [{"Key": k} for k in keys[i:i + 100]]})
            assert len(r["Deleted"]) == len(keys[i:i + 100]) and not r.get("Errors")
        s3.delete_bucket(Bucket="beta")
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["alpha"]
    check("boto3: ListObjects v1/v2 with prefixes, delimiters and pages, against a model", listings)

    def copies():
        data = rng.randbytes(1 << 20)
        s3.put_object(Bucket="alpha", Key="orig", Body=data, Metadata={"m": "1"})
        r = s3.copy_object(Bucket="alpha", Key="copy", CopySource={"Bucket": "alpha", "Key": "orig"})
        assert r["CopyObjectResult"]["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
        assert s3.get_object(Bucket="alpha", Key="copy")["Body"].read() == data
        assert s3.head_object(Bucket="alpha", Key="copy")["Metadata"] == {"m": "1"}
        s3.copy_object(Bucket="alpha", Key="copy2", CopySource={"Bucket": "alpha", "Key": "orig"},
                       MetadataDirective="REPLACE", Metadata={"m": "2"}, ContentType="text/x-replaced")
        h = s3.head_object(Bucket="alpha", Key="copy2")
        assert h["Metadata"] == {"m": "2"} and h["ContentType"] == "text/x-replaced"
        s3.put_object(Bucket="alpha", Key="orig", Body=b"overwritten")
        assert s3.get_object(Bucket="alpha", Key="copy")["Body"].read() == data, "the copy changed with its source"
        expect_error("NoSuchKey", lambda: s3.copy_object(Bucket="alpha", Key="c", CopySource={"Bucket": "alpha", "Key": "nope"}))
    check("boto3: CopyObject (a clone), metadata COPY and REPLACE", copies)

    def multipart():
        parts = [rng.randbytes(5 << 20), rng.randbytes(5 << 20), rng.randbytes(123_457)]
        up = s3.create_multipart_upload(Bucket="alpha", Key="mp/object", Metadata={"kind": "multipart"})
        uid = up["UploadId"]
        etags = []
        for i, body in enumerate(parts):
            etags.append(s3.upload_part(Bucket="alpha", Key="mp/object", UploadId=uid, PartNumber=i + 1, Body=body)["ETag"])
        listed = s3.list_parts(Bucket="alpha", Key="mp/object", UploadId=uid)["Parts"]
        assert [p["PartNumber"] for p in listed] == [1, 2, 3] and [p["Size"] for p in listed] == [len(p) for p in parts]
        uploads = s3.list_multipart_uploads(Bucket="alpha")["Uploads"]
        assert [u["UploadId"] for u in uploads] == [uid]
        expect_error("InvalidPartOrder", lambda: s3.complete_multipart_upload(
            Bucket="alpha", Key="mp/object", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": etags[1]}, {"PartNumber": 1, "ETag": etags[0]}]}))
        expect_error("InvalidPart", lambda: s3.complete_multipart_upload(
            Bucket="alpha", Key="mp/object", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etags[1]}]}))
        # Part 3 is small and not last.
        expect_error("EntityTooSmall", lambda: s3.complete_multipart_upload(
            Bucket="alpha", Key="mp/object", UploadId=uid,
            MultipartUpload={"Parts": [{"PartNumber": 3, "ETag": etags[2]}, {"PartNumber": 5, "ETag": etags[2]}]}))
        r = s3.complete_multipart_upload(Bucket="alpha", Key="mp/object", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]})
        md5s = b"".join(hashlib.md5(p).digest() for p in parts)
        assert r["ETag"] == f'"{hashlib.md5(md5s).hexdigest()}-3"', r["ETag"]
        g = s3.get_object(Bucket="alpha", Key="mp/object")
        assert g["Body"].read() == b"".join(parts) and g["Metadata"] == {"kind": "multipart"}
        assert s3.list_multipart_uploads(Bucket="alpha").get("Uploads", []) == []
        expect_error("NoSuchUpload", lambda: s3.list_parts(Bucket="alpha", Key="mp/object", UploadId=uid))
        up = s3.create_multipart_upload(Bucket="alpha", Key="mp/aborted")
        s3.upload_part(Bucket="alpha", Key="mp/aborted", UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 1000)
        s3.abort_multipart_upload(Bucket="alpha", Key="mp/aborted", UploadId=up["UploadId"])
        expect_error("NoSuchUpload", lambda: s3.upload_part(Bucket="alpha", Key="mp/aborted", UploadId=up["UploadId"], PartNumber=2, Body=b"y"))
        expect_error("NoSuchKey", lambda: s3.get_object(Bucket="alpha", Key="mp/aborted"))
        # ListMultipartUploads in pages of one, by key and then upload id; rolled up by a delimiter.
        made = [(k, s3.create_multipart_upload(Bucket="alpha", Key=k)["UploadId"]) for k in ["pg/b", "pg/a", "pg/b", "pg/x/1"]]
        seen, markers = [], {}
        while True:
            page = s3.list_multipart_uploads(Bucket="alpha", Prefix="pg/", MaxUploads=1, **markers)
            seen += [(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])]
            if not page["IsTruncated"]:
                break
            markers = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
        assert seen == sorted(made), (seen, sorted(made))
        rolled = s3.list_multipart_uploads(Bucket="alpha", Prefix="pg/", Delimiter="/")
        assert [u["Key"] for u in rolled["Uploads"]] == ["pg/a", "pg/b", "pg/b"], rolled
        assert [p["Prefix"] for p in rolled["CommonPrefixes"]] == ["pg/x/"], rolled
        for key, upload_id in made:
            s3.abort_multipart_upload(Bucket="alpha", Key=key, UploadId=upload_id)
        big = rng.randbytes(17 << 20)
        from boto3.s3.transfer import TransferConfig
        s3.upload_fileobj(io.BytesIO(big), "alpha", "mp/transfer", Config=TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20))
        out = io.BytesIO()
        s3.download_fileobj("alpha", "mp/transfer", out, Config=TransferConfig(multipart_threshold=4 << 20, multipart_chunksize=4 << 20))
        assert out.getvalue() == big
    check("boto3: multipart uploads (complete, errors, abort, list in pages, ranged download)", multipart)


def limits_suite(binary, work):
    gw = Gateway(binary, work, ["--max-object-size", "1M"])
    gw.start()
    try:
        s3 = gw.client()
        s3.create_bucket(Bucket="limits")

        def oversized():
            s3.put_object(Bucket="limits", Key="fits", Body=b"a" * (1 << 20))
            expect_error("EntityTooLarge", lambda: s3.put_object(Bucket="limits", Key="fits", Body=b"b" * ((1 << 20) + 1)))
            assert s3.get_object(Bucket="limits", Key="fits")["Body"].read() == b"a" * (1 << 20)
        check("limits: an oversized PUT is EntityTooLarge and changes nothing", oversized)

        def malformed():
            # Raw HTTP the server must answer with an error document or close, never crash.
            for raw in [b"GARBAGE / HTTP/1.1\r\n\r\n", b"PUT /limits/x HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\nabc",
                        b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00\xff" * 100]:
                with socket.create_connection(("127.0.0.1", gw.port)) as sock:
                    sock.settimeout(5)
                    sock.sendall(raw)
                    try:
                        sock.shutdown(socket.SHUT_WR)
                        sock.recv(65536)
                    except OSError:
                        pass
            s3.list_buckets()  # still serving
            assert gw.proc.poll() is None
        check("limits: malformed requests are refused and the gateway keeps serving", malformed)

        def refused_continue():
            # A PUT with `Expect: 100-continue` refused before its body: the client keeps
            # the body, so the server must close rather than read the next request's first
            # bytes as that body (a CI run once lost a HEAD's "H" this way: 403).
            with socket.create_connection(("127.0.0.1", gw.port)) as sock:
                sock.settimeout(5)
                sock.sendall(b"PUT /limits/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n")
                head = sock.recv(65536).split(b"\r\n\r\n")[0].lower()
                assert head.startswith(b"http/1.1 403") and b"connection: close" in head.split(b"\r\n"), head
            s3.put_object(Bucket="limits", Key="kept", Body=b"k")
            for _ in range(200):
                expect_error("KeyTooLongError", lambda: s3.put_object(Bucket="limits", Key="k" * 300, Body=b"x"))
                assert s3.head_object(Bucket="limits", Key="kept")["ContentLength"] == 1
        check("limits: a refused upload that waited for 100-continue closes its connection", refused_continue)
    finally:
        gw.stop()
    slow_clients_suite(binary, work)


def signed_put(gw, key, body):
    """The head of a SigV4-signed PUT of `body` (to send by hand, body after it)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    request = AWSRequest(method="PUT", url=f"{gw.endpoint()}/{key}", data=body)
    S3SigV4Auth(Credentials(ACCESS, SECRET), "s3", "us-east-1").add_auth(request)
    head = f"PUT /{key} HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in request.headers.items() if k.lower() not in ("content-length",))
    return (head + "\r\n").encode()


def slow_clients_suite(binary, work):
    """Clients that send part of a request and stall: each is cut off after the
    timeouts, while the gateway serves others; at most --max-connections at once."""
    gw = Gateway(binary, work, ["--header-timeout", "2", "--body-timeout", "2", "--max-connections", "40"])
    gw.start()
    try:
        s3 = gw.client()
        s3.create_bucket(Bucket="slow")

        def half_sent_heads():
            started = time.time()
            socks = []
            for _ in range(300):
                sock = socket.create_connection(("127.0.0.1", gw.port))
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
                socks.append(sock)
            t = time.time()
            s3.list_buckets()
            served = time.time() - t
            # At most 40 at once, each cut off after 2 s: a request waits for a slot, not forever.
            assert served < 10, f"a request behind 300 stalled ones waited {served:.1f} s"
            for sock in socks:
                sock.settimeout(30)
                try:
                    data = sock.recv(100)
                except OSError:
                    data = b""
                assert data == b"" or data.startswith(b"HTTP/1.1 408"), data
                sock.close()
            took = time.time() - started
            # 300 / 40 slots x 2 s each, and some slack: every one closed, none held for good.
            assert took < 40, f"the stalled connections took {took:.1f} s to be closed"
            assert gw.proc.poll() is None
        check("slow clients: 300 half-sent request heads are cut off after the header timeout while others are served", half_sent_heads)

        def stalled_body():
            body = b"x" * 100
            with socket.create_connection(("127.0.0.1", gw.port)) as sock:
                sock.sendall(signed_put(gw, "slow/stalled", body) + body[:10])
                sock.settimeout(30)
                t = time.time()
                reply = sock.recv(65536)
                waited = time.time() - t
                assert b"RequestTimeout" in reply, reply[:300]
                assert 1.5 < waited < 10, waited
            expect_error("404", lambda: s3.head_object(Bucket="slow", Key="stalled"))
            with socket.create_connection(("127.0.0.1", gw.port)) as sock:
                sock.sendall(signed_put(gw, "slow/whole", body) + body)
                sock.settimeout(30)
                assert sock.recv(65536).startswith(b"HTTP/1.1 200"), "a whole signed PUT sent by hand"
            assert s3.get_object(Bucket="slow", Key="whole")["Body"].read() == body
        check("slow clients: a body that stalls gets RequestTimeout and stores nothing", stalled_body)

        def quiet_log():
            expect_error("NoSuchKey", lambda: s3.get_object(Bucket="slow", Key="missing"))
            expect_error("SignatureDoesNotMatch", lambda: gw.client(secret="wrong-secret").list_buckets())
            with open(os.path.join(work, "s3.log")) as f:
                log = f.read()
            assert " ERROR " not in log and "\x1b[" not in log, log[-2000:]
        check("slow clients: a missing key and a bad signature are not logged as errors", quiet_log)
    finally:
        gw.stop()


# --- other clients ---------------------------------------------------------------------

def cli_env(gw):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS, AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION="us-east-1")
    env.pop("AWS_PROFILE", None)
    return env


def run(cmd, env=None, cwd=None):
    r = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, f"{cmd[0]} exited {r.returncode}:\n{r.stdout[-3000:]}"
    return r.stdout


def make_tree(root, rng):
    for i in range(12):
        path = os.path.join(root, f"d{i % 3}", f"f{i}.bin")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(rng.randbytes(rng.choice([0, 1, 4095, 4097, 100_000, 9 << 20])))


def same_tree(a, b):
    r = subprocess.run(["diff", "-r", a, b], stdout=subprocess.PIPE, text=True)
    assert r.returncode == 0, r.stdout[:2000]


def clients_suite(gw, work):
    rng = random.Random(11)
    src = os.path.join(work, "tree")
    make_tree(src, rng)
    env = cli_env(gw)

    def awscli():
        aws = ["aws", "--endpoint-url", gw.endpoint()]
        run(aws + ["s3", "mb", "s3://awscli"], env)
        run(aws + ["s3", "cp", "--recursive", src, "s3://awscli/tree"], env)
        listing = run(aws + ["s3", "ls", "--recursive", "s3://awscli/tree/"], env)
        assert listing.count("\n") == 12, listing
        out = os.path.join(work, "aws-out")
        run(aws + ["s3", "sync", "s3://awscli/tree", out], env)
        same_tree(src, out)
        meta = json.loads(run(aws + ["s3api", "head-object", "--bucket", "awscli", "--key", "tree/d0/f0.bin"], env))
        assert "ETag" in meta
        run(aws + ["s3", "rm", "--recursive", "s3://awscli/tree"], env)
        run(aws + ["s3", "rb", "s3://awscli"], env)
    check("awscli: mb, cp --recursive (multipart above 8 MiB), ls, sync back, head-object, rm, rb", awscli)

    def s3cmd():
        cfg = os.path.join(work, "s3cfg")
        with open(cfg, "w") as f:
            f.write(f"[default]\naccess_key = {ACCESS}\nsecret_key = {SECRET}\nhost_base = 127.0.0.1:{gw.port}\n"
                    f"host_bucket = 127.0.0.1:{gw.port}\nuse_https = False\nsignature_v2 = False\nbucket_location = us-east-1\n")
        cmd = ["s3cmd", "-c", cfg]
        run(cmd + ["mb", "s3://s3cmd"])
        run(cmd + ["put", "--recursive", src + "/", "s3://s3cmd/tree/"])
        assert run(cmd + ["ls", "--recursive", "s3://s3cmd/tree/"]).count("\n") == 12
        out = os.path.join(work, "s3cmd-out")
        os.makedirs(out)
        run(cmd + ["get", "--recursive", "s3://s3cmd/tree/", out + "/"])
        same_tree(src, out)
        run(cmd + ["del", "--recursive", "--force", "s3://s3cmd/tree/"])
        run(cmd + ["rb", "s3://s3cmd"])
    check("s3cmd: mb, put --recursive, ls, get, del, rb", s3cmd)

    def rclone():
        remote = ":s3:"
        # rclone 1.60 cannot use a CA bundle with its own transport; plain HTTP needs none.
        env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
        env.update(RCLONE_S3_PROVIDER="Other", RCLONE_S3_ACCESS_KEY_ID=ACCESS, RCLONE_S3_SECRET_ACCESS_KEY=SECRET,
                   RCLONE_S3_ENDPOINT=gw.endpoint(), RCLONE_S3_REGION="us-east-1", RCLONE_RETRIES="1")
        rc = lambda *a: run(["rclone", *a], env)  # noqa: E731
        rc("mkdir", remote + "rclone")
        rc("copy", src, remote + "rclone/tree", "--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M")
        rc("check", src, remote + "rclone/tree")
        out = os.path.join(work, "rclone-out")
        rc("copy", remote + "rclone/tree", out)
        same_tree(src, out)
        rc("purge", remote + "rclone")
    check("rclone: mkdir, copy (multipart), check (MD5), copy back, purge", rclone)

    # Keys that a client decoding its listing twice would mangle: each client lists them
    # as they were put (and the listed names open the objects).
    # Control characters XML carries (tab, DEL) list like any other; one it cannot (U+0001)
    # is refused when the object is made, since it would break every listing of the bucket
    # for a client that does not ask for URL-encoded names.
    odd = ["pct%41", "a+b c", "%2e%2e/%2e%2e/etc/passwd", "dir with space/\u00e9 \u00fc.txt", "plus+/and%2F", "x/y z+1",
           "tab\tkey", "del\x7fkey"]
    every = sorted(odd)
    s3 = gw.client()
    s3.create_bucket(Bucket="odd")
    for key in odd:
        s3.put_object(Bucket="odd", Key=key, Body=key.encode())

    def unlistable():
        for make in [lambda: s3.put_object(Bucket="odd", Key="ctl\x01key", Body=b"x"),
                     lambda: s3.create_multipart_upload(Bucket="odd", Key="cr\rkey"),
                     lambda: s3.copy_object(Bucket="odd", Key="ctl\x02key", CopySource={"Bucket": "odd", "Key": "pct%41"})]:
            expect_error("InvalidArgument", make)
    check("boto3: a key holding a character XML cannot carry is refused when the object is made", unlistable)

    def odd_boto3():
        v2 = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket="odd", PaginationConfig={"PageSize": 2})
              for o in p.get("Contents", [])]
        v1 = [o["Key"] for p in s3.get_paginator("list_objects").paginate(Bucket="odd", PaginationConfig={"PageSize": 2})
              for o in p.get("Contents", [])]
        assert v2 == every and v1 == every, (v1, v2)
        for key in v2:
            assert s3.get_object(Bucket="odd", Key=key)["Body"].read() == key.encode(), key
        rolled = s3.list_objects_v2(Bucket="odd", Delimiter="/", Prefix="")
        assert sorted(p["Prefix"] for p in rolled["CommonPrefixes"]) == ["%2e%2e/", "dir with space/", "plus+/", "x/"], rolled
        uploads = {k: s3.create_multipart_upload(Bucket="odd", Key=k)["UploadId"] for k in every}
        listed = [u["Key"] for p in s3.get_paginator("list_multipart_uploads").paginate(Bucket="odd", PaginationConfig={"PageSize": 3})
                  for u in p.get("Uploads", [])]
        assert sorted(listed) == every, listed
        for key, upload in uploads.items():
            s3.abort_multipart_upload(Bucket="odd", Key=key, UploadId=upload)
    check("boto3: keys with %, +, spaces, .., non-ASCII and control characters list as they were put (v1, v2, uploads)", odd_boto3)

    def odd_awscli():
        aws = ["aws", "--endpoint-url", gw.endpoint()]
        listed = json.loads(run(aws + ["s3api", "list-objects-v2", "--bucket", "odd"], env))
        assert sorted(o["Key"] for o in listed["Contents"]) == every, listed
        text = run(aws + ["s3", "ls", "--recursive", "s3://odd/"], env)
        names = [line.split(None, 3)[3] for line in text.splitlines() if line.strip()]
        assert sorted(names) == every, names
    check("awscli: s3api list-objects-v2 and s3 ls list the odd keys as they were put", odd_awscli)

    def odd_s3cmd():
        cfg = os.path.join(work, "s3cfg")
        text = run(["s3cmd", "-c", cfg, "ls", "--recursive", "s3://odd/"])
        names = [line.split(None, 3)[3][len("s3://odd/"):] for line in text.splitlines() if "s3://odd/" in line]
        assert sorted(names) == every, names
    check("s3cmd: ls lists the odd keys as they were put", odd_s3cmd)

    def odd_rclone():
        env2 = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
        env2.update(RCLONE_S3_PROVIDER="Other", RCLONE_S3_ACCESS_KEY_ID=ACCESS, RCLONE_S3_SECRET_ACCESS_KEY=SECRET,
                    RCLONE_S3_ENDPOINT=gw.endpoint(), RCLONE_S3_REGION="us-east-1", RCLONE_RETRIES="1")
        text = run(["rclone", "lsf", "-R", "--files-only", ":s3:odd"], env2)
        # rclone shows control characters as their Unicode pictures (U+2409 for a tab).
        shown = {chr(0x2400 + c): chr(c) for c in range(32)} | {"\u2421": "\x7f"}
        names = ["".join(shown.get(c, c) for c in line) for line in text.splitlines() if not line.startswith("20")]
        assert sorted(names) == every, names
    check("rclone: lsf -R lists the odd keys as they were put", odd_rclone)


# --- kill -9 ---------------------------------------------------------------------------

WRITER = r'''
import boto3, hashlib, json, os, random, sys
from botocore.config import Config
endpoint, seed, acks = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=os.environ["K"], aws_secret_access_key=os.environ["S"],
                  region_name="us-east-1", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
rng = random.Random(seed)
out = open(acks, "a", buffering=1)
while True:
    key = f"obj{rng.randrange(12)}"
    if rng.random() < 0.2:
        parts = [rng.randbytes(5 << 20), rng.randbytes(rng.randrange(1, 300_000))]
        out.write(json.dumps({"key": key, "pending": hashlib.md5(b"".join(parts)).hexdigest()}) + "\n")
        up = s3.create_multipart_upload(Bucket="crash", Key=key)
        out.write(json.dumps({"upload": up["UploadId"], "key": key}) + "\n")
        etags = [s3.upload_part(Bucket="crash", Key=key, UploadId=up["UploadId"], PartNumber=i + 1, Body=p)["ETag"] for i, p in enumerate(parts)]
        s3.complete_multipart_upload(Bucket="crash", Key=key, UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]})
        out.write(json.dumps({"completed": up["UploadId"]}) + "\n")
        body = b"".join(parts)
    else:
        body = rng.randbytes(rng.choice([1, 100, 4096, 4097, 65_536, 1_000_001]))
        out.write(json.dumps({"key": key, "pending": hashlib.md5(body).hexdigest()}) + "\n")
        s3.put_object(Bucket="crash", Key=key, Body=body)
    out.write(json.dumps({"key": key, "acked": hashlib.md5(body).hexdigest()}) + "\n")
'''


def kill_suite(binary, work, rounds):
    gw = Gateway(binary, work)
    gw.start()
    gw.client().create_bucket(Bucket="crash")
    acks = os.path.join(work, "acks.jsonl")
    writer_path = os.path.join(work, "writer.py")
    with open(writer_path, "w") as f:
        f.write(WRITER)
    rng = random.Random(5)
    known = {}  # key -> md5 of the last acknowledged version
    uploads = {}  # upload id -> key, for uploads created and not acknowledged complete
    for round_no in range(rounds):
        writer = subprocess.Popen([sys.executable, writer_path, gw.endpoint(), str(rng.randrange(1 << 30)), acks],
                                  env=dict(os.environ, K=ACCESS, S=SECRET), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.0, 4.0))
        gw.kill()
        writer.wait(timeout=60)
        pending = {}
        with open(acks) as f:
            for line in f:
                rec = json.loads(line)
                if "upload" in rec:
                    uploads[rec["upload"]] = rec["key"]
                elif "completed" in rec:
                    uploads.pop(rec["completed"], None)
                elif "pending" in rec:
                    pending[rec["key"]] = rec["pending"]
                else:
                    known[rec["key"]] = rec["acked"]
                    pending.pop(rec["key"], None)
        os.truncate(acks, 0)
        gw.start()

        def verify():
            s3 = gw.client()
            present = {o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket="crash") for o in page.get("Contents", [])}
            for key in set(known) | set(pending):
                allowed = {known.get(key), pending.get(key)} - {None}
                if key not in present:
                    assert key not in known, f"acknowledged {key} is gone"
                    continue
                got = hashlib.md5(s3.get_object(Bucket="crash", Key=key)["Body"].read()).hexdigest()
                assert got in allowed, f"{key}: md5 {got}, acknowledged {known.get(key)}, in flight {pending.get(key)}"
                known[key] = got
            # An upload the kill interrupted is absent or listed as incomplete, with
            # readable parts, and can be aborted; nothing else is listed.
            listed = {u["UploadId"]: u["Key"] for u in s3.list_multipart_uploads(Bucket="crash").get("Uploads", [])}
            for upload, key in listed.items():
                assert uploads.get(upload) == key, f"upload {upload} of {key} is listed but was completed or never made"
                s3.list_parts(Bucket="crash", Key=key, UploadId=upload)
                s3.abort_multipart_upload(Bucket="crash", Key=key, UploadId=upload)
            uploads.clear()
            assert not s3.list_multipart_uploads(Bucket="crash").get("Uploads"), "aborted uploads are still listed"
        check(f"kill -9 round {round_no + 1}: every acknowledged object reads back whole, interrupted uploads are "
              "absent or listed incomplete", verify)
    gw.stop()
    fsck_clean(binary, work, "kill -9: fsck is clean after the rounds")


# --- HTTPS -------------------------------------------------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tls_suite(binary, work):
    """HTTPS with a test CA's certificate: boto3, awscli and rclone trusting that CA; a
    client that does not, plain HTTP and TLS garbage refused without harm; the gateway
    refusing to listen beyond loopback without HTTPS and keys."""
    creds = os.path.join(work, "tls")
    subprocess.run([os.path.join(REPO, "scripts", "tls-credentials.sh"), creds], check=True)
    ca = os.path.join(creds, "ca-cert.pem")
    tls_args = ["--tls-cert", os.path.join(creds, "server-cert.pem"), "--tls-key", os.path.join(creds, "server-key.pem")]
    gw = Gateway(binary, work, tls_args, ca=ca)
    gw.start()
    rng = random.Random(12)
    try:
        s3 = gw.client()

        def boto3_https():
            s3.create_bucket(Bucket="secure")
            for size in [0, 4096, 4 << 20, 9 << 20]:
                body = rng.randbytes(size)
                s3.put_object(Bucket="secure", Key=f"o{size}", Body=body)
                assert s3.get_object(Bucket="secure", Key=f"o{size}")["Body"].read() == body
            assert len(s3.list_objects_v2(Bucket="secure")["Contents"]) == 4
        check("HTTPS: boto3 trusting the CA puts, gets and lists (0 B to 9 MiB)", boto3_https)

        def awscli_https():
            env = cli_env(gw)
            src = os.path.join(work, "aws-up.bin")
            with open(src, "wb") as f:
                f.write(rng.randbytes(12 << 20))
            aws = ["aws", "--endpoint-url", gw.endpoint(), "--ca-bundle", ca]
            run(aws + ["s3", "cp", src, "s3://secure/aws.bin"], env)
            run(aws + ["s3", "cp", "s3://secure/aws.bin", src + ".back"], env)
            same_tree(src, src + ".back")
        check("HTTPS: awscli with --ca-bundle copies up (multipart) and back", awscli_https)

        def rclone_https():
            tree = os.path.join(work, "rclone-tree")
            make_tree(tree, rng)
            # rclone's S3 SDK refuses AWS_CA_BUNDLE with rclone's own transport: the CA comes by --ca-cert.
            env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
            env.update(RCLONE_S3_PROVIDER="Other", RCLONE_S3_ACCESS_KEY_ID=ACCESS, RCLONE_S3_SECRET_ACCESS_KEY=SECRET,
                       RCLONE_S3_ENDPOINT=gw.endpoint(), RCLONE_S3_REGION="us-east-1", RCLONE_RETRIES="1")
            run(["rclone", "--ca-cert", ca, "copy", tree, ":s3:secure/tree"], env)
            run(["rclone", "--ca-cert", ca, "check", tree, ":s3:secure/tree"], env)
        check("HTTPS: rclone with --ca-cert copies a tree and checks it", rclone_https)

        def refused():
            untrusting = gw.client(verify=True)
            try:
                untrusting.list_buckets()
                raise AssertionError("a client that does not trust the CA was served")
            except Exception as e:  # botocore's SSLError
                assert "CERTIFICATE_VERIFY_FAILED" in str(e) or "certificate verify failed" in str(e), e
            plain = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{gw.port}", aws_access_key_id=ACCESS,
                                 aws_secret_access_key=SECRET, region_name="us-east-1",
                                 config=Config(retries={"max_attempts": 1}, connect_timeout=5, read_timeout=5))
            try:
                plain.list_buckets()
                raise AssertionError("plain HTTP was served on the HTTPS port")
            except ClientError as e:
                raise AssertionError(f"plain HTTP got an S3 answer: {e}")
            except Exception:
                pass
            # Garbage, and a record header claiming a handshake followed by garbage.
            for junk in [rng.randbytes(300), bytes([0x16, 3, 1, 2, 0, 1, 0, 1, 0xfc, 3, 3]) + rng.randbytes(200), b""]:
                with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
                    sock.sendall(junk)
                    sock.shutdown(socket.SHUT_WR)
                    sock.settimeout(5)
                    while sock.recv(4096):
                        pass
            assert s3.get_object(Bucket="secure", Key="o4096")["ContentLength"] == 4096, "served on after the abuse"
        check("HTTPS: an untrusting client, plain HTTP and TLS garbage are refused; the gateway serves on", refused)
    finally:
        gw.stop()
    fsck_clean(binary, work, "fsck is clean after the HTTPS clients")

    def beyond_loopback():
        port = free_port()
        ssd = ["--ssd", os.path.join(work, "ssd.img")]
        keys = ["--keys", os.path.join(work, "keys")]
        for extra in [keys, ["--anonymous", *tls_args]]:
            r = subprocess.run([binary, "s3", *ssd, "--listen", f"0.0.0.0:{port}", *extra], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=20)
            assert r.returncode != 0 and "--insecure-listen" in r.stdout, r.stdout
    check("beyond loopback, plain HTTP or anonymous access is refused, with how to allow it", beyond_loopback)


def fsck_clean(binary, work, name):
    r = subprocess.run([binary, "fsck", "--ssd", os.path.join(work, "ssd.img")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def clean():
        assert r.returncode == 0 and r.stdout.rstrip().endswith("clean"), r.stdout[-2000:]
    check(name, clean)


def stat_counts(binary, work):
    def counted():
        r = subprocess.run([binary, "stat", "--json", "--ssd", os.path.join(work, "ssd.img")], stdout=subprocess.PIPE, text=True, check=True)
        counters = json.loads(r.stdout)["counters"]
        for name in ["kv_batches", "kv_block_bytes", "kv_fragment_bytes", "kv_onode_bytes", "kv_attr_bytes", "kv_name_bytes",
                     "clean_page_hits"]:
            assert counters[name] > 0, f"{name} is {counters[name]} after the client suites"
    check("stat counts the KV store's traffic and the clean pages' hits", counted)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("work")
    parser.add_argument("--kill-rounds", type=int, default=4)
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    for name in ["clients", "tls", "limits", "kill"]:
        os.makedirs(os.path.join(args.work, name), exist_ok=True)
    main_work = os.path.join(args.work, "clients")
    format_store(binary, main_work)
    gw = Gateway(binary, main_work)
    gw.start()
    try:
        boto3_suite(gw)
        clients_suite(gw, main_work)
    finally:
        gw.stop()
    fsck_clean(binary, main_work, "fsck is clean after the client suites")
    stat_counts(binary, main_work)
    format_store(binary, os.path.join(args.work, "tls"))
    tls_suite(binary, os.path.join(args.work, "tls"))
    format_store(binary, os.path.join(args.work, "limits"))
    limits_suite(binary, os.path.join(args.work, "limits"))
    format_store(binary, os.path.join(args.work, "kill"))
    kill_suite(binary, os.path.join(args.work, "kill"), args.kill_rounds)
    print(f"suite totals: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
