// Everything a plugin needs: #include "colibri/sdk/sdk.hpp".
#pragma once

#include "colibri/sdk/cache_policy.hpp"
#include "colibri/sdk/compute.hpp"
#include "colibri/sdk/compute_checks.hpp"
#include "colibri/sdk/config.hpp"
#include "colibri/sdk/dtype.hpp"
#include "colibri/sdk/host.hpp"
#include "colibri/sdk/os_error.hpp"
#include "colibri/sdk/plugin.hpp"
#include "colibri/sdk/status.hpp"
#include "colibri/sdk/storage.hpp"
