#!/usr/bin/python3
"""Seeds for the s3_request fuzz target (fuzz/fuzz_targets/s3_request.rs): raw HTTP/1.1
requests as S3 clients send them, signed (SigV4, by botocore) with the key the target
accepts, alone and several on one kept-alive connection, so that the fuzzer starts from
requests that pass the signature check and mutates those. Signed now: SigV4 allows
15 minutes of clock skew, so scripts/fuzz.sh writes them fresh for each run.

usage: fuzz_seeds.py DIR   (writes DIR/s3_request/*)
"""

import os
import sys

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

# What fuzz/fuzz_targets/s3_request.rs accepts.
ACCESS, SECRET = "fuzz-access", "fuzz-secret-key-0123"
HOST = "127.0.0.1:9000"


def request(method, path, query="", body=b"", headers=None, sign=True):
    url = f"http://{HOST}{path}" + (f"?{query}" if query else "")
    req = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
    if sign:
        S3SigV4Auth(Credentials(ACCESS, SECRET), "s3", "us-east-1").add_auth(req)
    prepared = req.prepare()
    target = prepared.url[len(f"http://{HOST}"):]
    lines = [f"{method} {target} HTTP/1.1", f"Host: {HOST}"]
    lines += [f"{k}: {v}" for k, v in prepared.headers.items() if k.lower() not in ("host", "content-length")]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def main():
    out = os.path.join(sys.argv[1], "s3_request")
    os.makedirs(out, exist_ok=True)
    complete = (b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>\"x\"</ETag></Part>"
                b"</CompleteMultipartUpload>")
    delete = b"<Delete><Object><Key>a</Key></Object><Object><Key>b/c</Key></Object></Delete>"
    seeds = {
        "list_buckets": [request("GET", "/")],
        "create_bucket": [request("PUT", "/fuzz")],
        "put_get": [request("PUT", "/fuzz"), request("PUT", "/fuzz/a/b.txt", body=b"hello, fuzz" * 40),
                    request("GET", "/fuzz/a/b.txt", headers={"Range": "bytes=3-100"})],
        "head_delete": [request("PUT", "/fuzz"), request("PUT", "/fuzz/k", body=b"v"), request("HEAD", "/fuzz/k"),
                        request("DELETE", "/fuzz/k")],
        "list_v2": [request("PUT", "/fuzz"), request("PUT", "/fuzz/d/e", body=b"1"),
                    request("GET", "/fuzz", "delimiter=%2F&encoding-type=url&list-type=2&max-keys=2&prefix=d")],
        "list_v1": [request("GET", "/fuzz", "marker=a&max-keys=5&prefix=")],
        "multipart": [request("PUT", "/fuzz"), request("POST", "/fuzz/big", "uploads="),
                      request("PUT", "/fuzz/big", "partNumber=1&uploadId=0000", body=b"p" * 1000),
                      request("POST", "/fuzz/big", "uploadId=0000", body=complete)],
        "delete_objects": [request("POST", "/fuzz", "delete=", body=delete,
                                   headers={"Content-MD5": "AAAAAAAAAAAAAAAAAAAAAA=="})],
        "copy": [request("PUT", "/fuzz"), request("PUT", "/fuzz/src", body=b"s"),
                 request("PUT", "/fuzz/dst", headers={"x-amz-copy-source": "/fuzz/src"})],
        "metadata": [request("PUT", "/fuzz/m", body=b"m", headers={"x-amz-meta-colour": "blue",
                                                                 "Content-Type": "text/plain"})],
        "unsigned": [request("GET", "/", sign=False)],
        # A chunked body (its signature covers an empty one: refused after the body is read).
        "chunked": [request("PUT", "/fuzz/c", headers={"Transfer-Encoding": "chunked"}).replace(b"Content-Length: 0\r\n", b"")
                    + b"5\r\nhello\r\n0\r\n\r\n"],
    }
    for name, requests in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(b"".join(requests))


if __name__ == "__main__":
    main()
