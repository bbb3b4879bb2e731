#include "launcher/security_flags.h"

namespace crun::launcher {

void AddSecurityFlags(CLI::App* app, crun::SecurityFlags* f) {
  app->add_option("--token-file", f->token_file,
                  "File holding the job token every rendezvous call must carry "
                  "(else CRUN_TOKEN_FILE, CRUN_TOKEN)")
      ->group("Security");
  app->add_option("--tls-cert", f->tls_cert,
                  "PEM certificate: the service's, or this "
                  "client's for mutual TLS (else CRUN_TLS_CERT)")
      ->group("Security");
  app->add_option("--tls-key", f->tls_key, "PEM private key of --tls-cert (else CRUN_TLS_KEY)")
      ->group("Security");
  app->add_option("--tls-ca", f->tls_ca,
                  "PEM CA: clients verify the service with it; a "
                  "service with it requires client certificates (else CRUN_TLS_CA)")
      ->group("Security");
}

}  // namespace crun::launcher
