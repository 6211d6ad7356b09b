#include "support/gen.h"
