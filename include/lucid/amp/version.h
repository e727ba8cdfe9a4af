#pragma once

/// lucid-amp's own version.
#define LUCID_AMP_VERSION_MAJOR 0
#define LUCID_AMP_VERSION_MINOR 1
#define LUCID_AMP_VERSION_PATCH 0
