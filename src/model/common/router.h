#include "model/common/mhc.h"
