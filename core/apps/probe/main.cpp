// colibri-plugin-probe: run by colibri, not by hand (registry.hpp, ScanOptions::probe).
#include "colibri/registry/registry.hpp"

int main(int argc, char** argv) {
  return colibri::registry::PluginRegistry::probe_main(argc, argv);
}
