"""The local GCS of tests/gcs_emulator.py: TensorFlow's own gs:// client
reaches it through the proxy, and nothing else gets through."""

import os
import socket
import subprocess
import sys
import textwrap
import urllib.parse

import pytest
import tensorflow as tf

import gcs_emulator as emulator

gfile = tf.io.gfile


def _object(request):
  """The object a request names (uploads: `name=`; JSON API: `/o/NAME`;
  downloads: `/BUCKET/NAME`), or None."""
  path, _, query = request.path.partition("?")
  names = urllib.parse.parse_qs(query).get("name")
  if names:
    return names[0]
  if request.host == "storage.googleapis.com":
    return urllib.parse.unquote(path.split("/", 2)[2])
  if "/o/" in path:
    return urllib.parse.unquote(path.split("/o/", 1)[1].split("/", 1)[0])
  return None


def _count(requests, method, name, host="www.googleapis.com", marker=""):
  return sum(1 for r in requests if r.method == method and r.host == host
             and _object(r) == name and marker in r.path)


def test_gfile_operations_reach_the_emulator(gcs_emulator, gcs_bucket):
  bucket_name = gcs_bucket[len("gs://"):]
  root = f"{gcs_bucket}/run"
  first = len(gcs_emulator.requests)

  gfile.makedirs(f"{root}/sub")
  assert gfile.isdir(f"{root}/sub")
  with gfile.GFile(f"{root}/a.txt", "w") as f:
    f.write("hello")
  assert gfile.GFile(f"{root}/a.txt").read() == "hello"
  big = bytes(range(256)) * (9 * 2**20 // 256)  # 9 MiB: over 8 MiB.
  with gfile.GFile(f"{root}/big.bin", "wb") as f:
    f.write(big)
  assert gfile.GFile(f"{root}/big.bin", "rb").read() == big
  # Directories come back with a trailing "/" from listdir, without from
  # glob.
  assert sorted(gfile.listdir(root)) == ["a.txt", "big.bin", "sub/"]
  assert sorted(gfile.glob(f"{root}/*")) == [
      f"{root}/a.txt", f"{root}/big.bin", f"{root}/sub"]
  assert gfile.glob(f"{root}/*.txt") == [f"{root}/a.txt"]
  gfile.rename(f"{root}/a.txt", f"{root}/b.txt")
  assert not gfile.exists(f"{root}/a.txt")
  assert gfile.GFile(f"{root}/b.txt").read() == "hello"
  gfile.rmtree(root)
  assert not gfile.exists(root)
  assert not gfile.exists(f"{root}/b.txt")
  assert gfile.listdir(gcs_bucket) == []

  requests = gcs_emulator.requests[first:]
  assert {r.host for r in requests} == set(emulator.GOOGLE_HOSTS)
  assert all(bucket_name in r.path.partition("?")[0].split("/")
             for r in requests), requests
  # makedirs: an empty object per level, in one request each.
  for marker in ("run/", "run/sub/"):
    assert _count(requests, "POST", marker, marker="uploadType=media") == 1
  # Every file write is one resumable upload (start, then all the data in
  # one PUT at close), 9 MiB too.
  for name in ("run/a.txt", "run/big.bin"):
    assert _count(requests, "POST", name, marker="uploadType=resumable") == 1
    assert _count(requests, "PUT", name, marker="upload_id=") == 1
  # Each read is one download; the rename one copy and one delete.
  for name in ("run/a.txt", "run/big.bin", "run/b.txt"):
    assert _count(requests, "GET", name, host="storage.googleapis.com") == 1
  assert _count(requests, "POST", "run/a.txt", marker="/rewriteTo/") == 1
  assert _count(requests, "DELETE", "run/a.txt") == 1
  # rmtree deletes the three objects left and both directory markers.
  for name in ("run/", "run/sub/", "run/b.txt", "run/big.bin"):
    assert _count(requests, "DELETE", name) == 1
  assert gcs_emulator.refused == []


def _proxy_answer(gcs_emulator, request: bytes) -> bytes:
  """The status line the proxy answers a raw request with."""
  port = int(gcs_emulator.environment["HTTPS_PROXY"].rsplit(":", 1)[1])
  with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
    s.sendall(request)
    return s.makefile("rb").readline()


def test_proxy_refuses_other_hosts_and_plain_requests(gcs_emulator):
  first_request = len(gcs_emulator.requests)
  first_refused = len(gcs_emulator.refused)
  for request in (
      b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
      b"CONNECT www.googleapis.com:80 HTTP/1.1\r\n\r\n",
      b"GET http://www.googleapis.com/storage/v1/b HTTP/1.1\r\n"
      b"Host: www.googleapis.com\r\n\r\n"):
    assert _proxy_answer(gcs_emulator, request).startswith(b"HTTP/1.1 403 ")
  assert gcs_emulator.refused[first_refused:] == [
      emulator.Refused("CONNECT", "example.com:443"),
      emulator.Refused("CONNECT", "www.googleapis.com:80"),
      emulator.Refused("GET", "http://www.googleapis.com/storage/v1/b")]
  assert len(gcs_emulator.requests) == first_request


_CHILD = textwrap.dedent("""
    import sys
    import urllib.request
    import tensorflow as tf
    bucket, emulator_url = sys.argv[1:]
    print(tf.io.gfile.GFile(bucket + "/from-parent").read())
    with tf.io.gfile.GFile(bucket + "/from-child", "w") as f:
      f.write("child")
    # Stats are not cached here: an object deleted behind TensorFlow's back
    # (straight at the emulator) is gone at once.
    with tf.io.gfile.GFile(bucket + "/scratch", "w") as f:
      f.write("x")
    assert tf.io.gfile.exists(bucket + "/scratch")
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        urllib.request.Request(
            emulator_url + "/storage/v1/b/" + bucket[len("gs://"):]
            + "/o/scratch", method="DELETE"))
    print(tf.io.gfile.exists(bucket + "/scratch"))
""")


@pytest.mark.slow  # A TensorFlow process (6 s); tests/test_cloud_storage.py
# runs every child this way too.
def test_child_process_inherits_the_emulator(gcs_emulator, gcs_bucket):
  with gfile.GFile(f"{gcs_bucket}/from-parent", "w") as f:
    f.write("parent")
  first = len(gcs_emulator.requests)
  child = subprocess.run(
      [sys.executable, "-c", _CHILD, gcs_bucket, gcs_emulator.emulator_url],
      capture_output=True, text=True, timeout=120, env=dict(os.environ),
      check=False)
  assert child.returncode == 0, child.stderr
  assert child.stdout.split() == ["parent", "False"]
  assert gfile.GFile(f"{gcs_bucket}/from-child").read() == "child"
  # The child's requests went through this process's proxy.
  assert _count(gcs_emulator.requests[first:], "PUT", "from-child",
                marker="upload_id=") == 1
