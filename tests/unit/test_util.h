// Helpers shared by crun's unit tests.
#pragma once

#include <chrono>
#include <memory>
#include <thread>

#include "rendezvous/store/tcp_store_client.h"
#include "rendezvous/store_server/store_server.h"

namespace crun::testing {

// Polls `condition` until it holds or `limit` passes; returns whether it held. For waiting on
// an observable state (a waiter registered, a connection counted), never as a delay.
template <typename Condition>
bool Eventually(Condition condition, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

inline std::unique_ptr<BackgroundStoreServer> StartServer(StoreServerOptions options = {}) {
  if (options.host == "::") options.host = "127.0.0.1";
  auto server = BackgroundStoreServer::Start(options);
  if (!server.ok()) throw std::runtime_error(server.status().ToString());
  return std::move(server).value();
}

inline std::unique_ptr<TcpStoreClient> ConnectClient(std::uint16_t port,
                                                     Millis timeout = std::chrono::seconds(30),
                                                     const std::string& host = "127.0.0.1") {
  TcpStoreClientOptions options;
  options.host = host;
  options.port = port;
  options.connect_timeout = std::chrono::seconds(30);
  options.timeout = timeout;
  auto client = TcpStoreClient::Connect(options);
  if (!client.ok()) throw std::runtime_error(client.status().ToString());
  return std::move(client).value();
}

}  // namespace crun::testing
