// Rendezvous stores: Gloo's FileStore behind kiln's Store, and a TCP store (this Debian Gloo has
// none: it ships only file, hash and Redis stores) that the master serves from a thread.
//
// TCP store protocol: each request is one byte of opcode followed by length-prefixed strings
// (uint32 length, then the bytes); the server answers each request before reading the next.
//   SET key value -> (nothing)      GET key -> found byte, value      CHECK n keys... -> byte
// Waiting is the client polling CHECK: the store carries a handful of keys per rank, at
// rendezvous and on failures, so its speed does not matter.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <gloo/common/error.h>
#include <gloo/rendezvous/file_store.h>

#include "kiln/distributed.h"
#include "kiln/error.h"
#include "lib/distributed/internal.h"

namespace kiln::distributed {
namespace {

using Clock = std::chrono::steady_clock;

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (const std::string& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

// Gloo's FileStore with its (protected) check and key paths made public.
struct GlooFileStore : gloo::rendezvous::FileStore {
  using gloo::rendezvous::FileStore::check;
  using gloo::rendezvous::FileStore::FileStore;
  using gloo::rendezvous::FileStore::objectPath;
};

enum Op : uint8_t { kSet = 1, kGet = 2, kCheck = 3 };

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool write_string(int fd, const std::string& s) {
  uint32_t n = htonl(static_cast<uint32_t>(s.size()));
  return write_all(fd, &n, 4) && write_all(fd, s.data(), s.size());
}

bool read_string(int fd, std::string* s) {
  uint32_t n = 0;
  if (!read_all(fd, &n, 4)) return false;
  s->resize(ntohl(n));
  return read_all(fd, s->data(), s->size());
}

// The master's side: one thread accepting, one per connection (a connection per rank).
class StoreServer {
 public:
  explicit StoreServer(int port) {
    listen_fd_ = ::socket(AF_INET6, SOCK_STREAM, 0);
    KILN_CHECK(listen_fd_ >= 0, "TCPStore: socket failed: ", std::strerror(errno));
    int on = 1, off = 0;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));  // IPv4 too
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd_, 128) != 0) {
      int err = errno;
      ::close(listen_fd_);
      KILN_FAIL("TCPStore: cannot serve on port ", port, ": ", std::strerror(err));
    }
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin6_port);
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  ~StoreServer() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    accept_thread_.join();
    ::close(listen_fd_);
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
      threads.swap(client_threads_);
    }
    for (std::thread& t : threads) t.join();
  }

  int port() const { return port_; }

 private:
  void accept_loop() {
    for (;;) {
      int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // shut down
      }
      std::lock_guard<std::mutex> lock(mu_);
      client_fds_.push_back(fd);
      client_threads_.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    while (handle(fd)) {
    }
    ::close(fd);
  }

  bool handle(int fd) {
    uint8_t op = 0;
    if (!read_all(fd, &op, 1)) return false;
    std::string key, value;
    if (op == kSet) {
      if (!read_string(fd, &key) || !read_string(fd, &value)) return false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        data_[key] = std::move(value);
      }
      // Acknowledged once stored, so that a read on another connection after set returns sees it.
      const uint8_t stored = 1;
      return write_all(fd, &stored, 1);
    }
    if (op == kGet) {
      if (!read_string(fd, &key)) return false;
      uint8_t found = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = data_.find(key);
        if (it != data_.end()) found = 1, value = it->second;
      }
      return write_all(fd, &found, 1) && write_string(fd, value);
    }
    if (op == kCheck) {
      uint32_t n = 0;
      if (!read_all(fd, &n, 4)) return false;
      uint8_t all = 1;
      for (uint32_t i = 0; i < ntohl(n); ++i) {
        if (!read_string(fd, &key)) return false;
        std::lock_guard<std::mutex> lock(mu_);
        all &= data_.count(key) ? 1 : 0;
      }
      return write_all(fd, &all, 1);
    }
    return false;  // not a client of ours
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::thread accept_thread_;
  std::mutex mu_;                            // guards everything below
  std::map<std::string, std::string> data_;  // the store's contents
  std::vector<int> client_fds_;              // connections, shut down on destruction
  std::vector<std::thread> client_threads_;  // their threads
};

int connect_to(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error;
  auto deadline = Clock::now() + timeout;
  do {
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) {
      last_error = ::gai_strerror(rc);
    } else {
      for (addrinfo* a = res; a; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          ::freeaddrinfo(res);
          int on = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
          return fd;
        }
        last_error = std::strerror(errno);
        ::close(fd);
      }
      ::freeaddrinfo(res);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the master may start later
  } while (Clock::now() < deadline);
  KILN_FAIL("TCPStore: cannot connect to ", host, ":", port, " within ", timeout.count(),
            " ms: ", last_error);
}

}  // namespace

// ------------------------------------------------------------------------------- FileStore

struct FileStore::Impl {
  explicit Impl(const std::string& path) : store(path) {}
  GlooFileStore store;
};

FileStore::FileStore(const std::string& path, std::chrono::milliseconds timeout) : Store(timeout) {
  // Gloo's FileStore wants the directory to exist; the first rank to get here makes it.
  KILN_CHECK(::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST, "FileStore: cannot create '",
             path, "': ", std::strerror(errno));
  try {
    impl_ = std::make_unique<Impl>(path);
  } catch (const std::exception& e) {
    KILN_FAIL("FileStore: cannot use '", path, "': ", e.what());
  }
}

FileStore::~FileStore() = default;

void FileStore::set(const std::string& key, const std::vector<char>& value) {
  try {
    // Gloo's set refuses an existing key; kiln's overwrites it (a rank's arrival record), and a
    // reader in between waits for the new file as for a key not yet set.
    if (impl_->store.check({key})) ::unlink(impl_->store.objectPath(key).c_str());
    impl_->store.set(key, value);
  } catch (const std::exception& e) {
    KILN_FAIL("FileStore::set('", key, "'): ", e.what());
  }
}

std::vector<char> FileStore::get(const std::string& key) {
  wait({key});
  return impl_->store.get(key);
}

bool FileStore::check(const std::vector<std::string>& keys) {
  return impl_->store.check(keys);
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  try {
    impl_->store.wait(keys, timeout);
  } catch (const gloo::IoException&) {
    KILN_FAIL("FileStore: timed out after ", timeout.count(), " ms waiting for keys ",
              join_keys(keys));
  }
}

// -------------------------------------------------------------------------------- TCPStore

struct TCPStore::Impl {
  std::unique_ptr<StoreServer> server;
  std::string host;
  int port = 0;
  std::mutex mu;  // guards fd: one request at a time on the connection
  int fd = -1;

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }

  // Sends a request and reads its answer, with the connection held.
  template <typename Body>
  auto request(const char* what, const std::string& key, Body body) {
    std::lock_guard<std::mutex> lock(mu);
    auto result = body(fd);
    KILN_CHECK(result.first, "TCPStore::", what, "('", key,
               "'): lost the connection to the store at ", host, ":", port,
               " (its master process exited?)");
    return result.second;
  }
};

TCPStore::TCPStore(const std::string& host, int port, bool is_master,
                   std::chrono::milliseconds timeout)
    : Store(timeout), impl_(std::make_unique<Impl>()) {
  if (is_master) {
    impl_->server = std::make_unique<StoreServer>(port);
    port = impl_->server->port();
  }
  impl_->host = host;
  impl_->port = port;
  impl_->fd = connect_to(host, port, timeout);
}

TCPStore::~TCPStore() = default;

int TCPStore::port() const {
  return impl_->port;
}

const std::string& TCPStore::host() const {
  return impl_->host;
}

void TCPStore::set(const std::string& key, const std::vector<char>& value) {
  impl_->request("set", key, [&](int fd) {
    uint8_t op = kSet;
    uint8_t stored = 0;
    bool ok = write_all(fd, &op, 1) && write_string(fd, key) &&
              write_string(fd, std::string(value.begin(), value.end())) &&
              read_all(fd, &stored, 1) && stored == 1;
    return std::make_pair(ok, 0);
  });
}

std::vector<char> TCPStore::get(const std::string& key) {
  wait({key});
  return impl_->request("get", key, [&](int fd) {
    uint8_t op = kGet, found = 0;
    std::string value;
    bool ok = write_all(fd, &op, 1) && write_string(fd, key) && read_all(fd, &found, 1) &&
              read_string(fd, &value);
    return std::make_pair(ok, std::vector<char>(value.begin(), value.end()));
  });
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  return impl_->request("check", join_keys(keys), [&](int fd) {
    uint8_t op = kCheck, all = 0;
    uint32_t n = htonl(static_cast<uint32_t>(keys.size()));
    bool ok = write_all(fd, &op, 1) && write_all(fd, &n, 4);
    for (const std::string& k : keys) ok = ok && write_string(fd, k);
    ok = ok && read_all(fd, &all, 1);
    return std::make_pair(ok, all != 0);
  });
}

void TCPStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (!check(keys)) {
    KILN_CHECK(Clock::now() < deadline, "TCPStore: timed out after ", timeout.count(),
               " ms waiting for keys ", join_keys(keys));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// ----------------------------------------------------------------- kiln's store as Gloo's

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_.set(key, data);
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  return store_.get(key);
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  store_.wait(keys);
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  store_.wait(keys, timeout);
}

}  // namespace kiln::distributed
