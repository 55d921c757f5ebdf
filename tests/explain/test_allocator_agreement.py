"""Cases where explain and the scheduler's allocator (``bin/<minor>/allocate``) once
disagreed, found by tests/realk8s/test_explain_differential.py: each is the input and the
allocator's recorded answer per minor; explain must give the same answer (fit, exact results,
config, node selector, error). The fast suite needs no allocate binary.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.explain.differential import (
    FEATURES,
    answer_of_allocator,
    answer_of_explain,
    compare,
    explain_case,
    uids_of,
)

# 1.35's allocator names the request in a class config that applies to every request (1.37
# clears ``requests`` then: empty means all; explain writes 1.37's).
CLASS_CONFIG: dict[str, Any] = json.loads(r"""
{
 "node": "node-a",
 "labels": {
  "kubernetes.io/hostname": "node-a"
 },
 "claim": {
  "apiVersion": "resource.k8s.io/v1",
  "kind": "ResourceClaim",
  "metadata": {
   "name": "job",
   "namespace": "default",
   "uid": "uid-job"
  },
  "spec": {
   "devices": {
    "requests": [
     {
      "name": "r0",
      "exactly": {
       "deviceClassName": "class-0",
       "allocationMode": "ExactCount",
       "count": 1
      }
     }
    ]
   }
  }
 },
 "classes": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "DeviceClass",
   "metadata": {
    "name": "class-0"
   },
   "spec": {
    "config": [
     {
      "opaque": {
       "driver": "a.example.com",
       "parameters": {
        "class": "class-0"
       }
      }
     }
    ]
   }
  }
 ],
 "slices": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-0-a0"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-0",
     "generation": 0,
     "resourceSliceCount": 1
    },
    "devices": [
     {
      "name": "dev-0"
     }
    ]
   }
  }
 ],
 "allocated": []
}
""")
CLASS_CONFIG_ANSWERS: dict[str, Any] = json.loads(r"""
{
 "1.35": {
  "allocations": {
   "uid-job": {
    "devices": {
     "results": [
      {
       "request": "r0",
       "driver": "a.example.com",
       "pool": "pool-0",
       "device": "dev-0"
      }
     ],
     "config": [
      {
       "source": "FromClass",
       "requests": [
        "r0"
       ],
       "opaque": {
        "driver": "a.example.com",
        "parameters": {
         "class": "class-0"
        }
       }
      }
     ]
    },
    "nodeSelector": {
     "nodeSelectorTerms": [
      {
       "matchFields": [
        {
         "key": "metadata.name",
         "operator": "In",
         "values": [
          "node-a"
         ]
        }
       ]
      }
     ]
    }
   }
  }
 },
 "1.37": {
  "allocations": {
   "uid-job": {
    "devices": {
     "results": [
      {
       "request": "r0",
       "driver": "a.example.com",
       "pool": "pool-0",
       "device": "dev-0"
      }
     ],
     "config": [
      {
       "source": "FromClass",
       "opaque": {
        "driver": "a.example.com",
        "parameters": {
         "class": "class-0"
        }
       }
      }
     ]
    },
    "nodeSelector": {
     "nodeSelectorTerms": [
      {
       "matchFields": [
        {
         "key": "metadata.name",
         "operator": "In",
         "values": [
          "node-a"
         ]
        }
       ]
      }
     ]
    }
   }
  }
 }
}
""")

# firstAvailable [s0: a.example.com device, s1: All of class-1], then r1 one class-1 device:
# 1.37 gives s1 all three devices, so r1 has none left; 1.35 gives s1 one device.
ALL_SUBREQUEST: dict[str, Any] = json.loads(r"""
{
 "node": "node-a",
 "labels": {
  "kubernetes.io/hostname": "node-a"
 },
 "claim": {
  "apiVersion": "resource.k8s.io/v1",
  "kind": "ResourceClaim",
  "metadata": {
   "name": "job",
   "namespace": "default",
   "uid": "uid-job"
  },
  "spec": {
   "devices": {
    "requests": [
     {
      "name": "r0",
      "firstAvailable": [
       {
        "name": "s0",
        "deviceClassName": "class-0",
        "allocationMode": "ExactCount",
        "count": 1
       },
       {
        "name": "s1",
        "deviceClassName": "class-1",
        "allocationMode": "All"
       }
      ]
     },
     {
      "name": "r1",
      "exactly": {
       "deviceClassName": "class-1",
       "allocationMode": "ExactCount",
       "count": 1
      }
     }
    ]
   }
  }
 },
 "classes": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "DeviceClass",
   "metadata": {
    "name": "class-0"
   },
   "spec": {
    "selectors": [
     {
      "cel": {
       "expression": "device.driver == \"a.example.com\""
      }
     }
    ]
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "DeviceClass",
   "metadata": {
    "name": "class-1"
   },
   "spec": {}
  }
 ],
 "slices": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "b.example.com-pool-1-a0"
   },
   "spec": {
    "driver": "b.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-1",
     "generation": 0,
     "resourceSliceCount": 1
    },
    "devices": [
     {
      "name": "dev-0"
     },
     {
      "name": "dev-1"
     },
     {
      "name": "dev-2"
     }
    ]
   }
  }
 ],
 "allocated": []
}
""")
ALL_SUBREQUEST_ANSWERS: dict[str, Any] = json.loads(r"""
{
 "1.35": {
  "allocations": {
   "uid-job": {
    "devices": {
     "results": [
      {
       "request": "r0/s1",
       "driver": "b.example.com",
       "pool": "pool-1",
       "device": "dev-0"
      },
      {
       "request": "r1",
       "driver": "b.example.com",
       "pool": "pool-1",
       "device": "dev-1"
      }
     ]
    },
    "nodeSelector": {
     "nodeSelectorTerms": [
      {
       "matchFields": [
        {
         "key": "metadata.name",
         "operator": "In",
         "values": [
          "node-a"
         ]
        }
       ]
      }
     ]
    }
   }
  }
 },
 "1.37": {
  "unschedulable": true,
  "error": "cannot allocate all claims"
 }
}
""")


# A claim config naming no request: 1.35's allocator leaves ``requests`` out of the result
# (omitempty), explain wrote ``requests: []``.
CLAIM_CONFIG_ALL: dict[str, Any] = json.loads(r"""
{
 "node": "node-a",
 "labels": {
  "kubernetes.io/hostname": "node-a"
 },
 "claim": {
  "apiVersion": "resource.k8s.io/v1",
  "kind": "ResourceClaim",
  "metadata": {
   "name": "job",
   "namespace": "default",
   "uid": "uid-job"
  },
  "spec": {
   "devices": {
    "requests": [
     {
      "name": "r0",
      "exactly": {
       "deviceClassName": "class-0",
       "allocationMode": "ExactCount",
       "count": 1
      }
     }
    ],
    "config": [
     {
      "opaque": {
       "driver": "a.example.com",
       "parameters": {
        "claim": true
       }
      }
     }
    ]
   }
  }
 },
 "classes": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "DeviceClass",
   "metadata": {
    "name": "class-0"
   },
   "spec": {}
  }
 ],
 "slices": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-0-a0"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-0",
     "generation": 0,
     "resourceSliceCount": 1
    },
    "devices": [
     {
      "name": "dev-0"
     }
    ]
   }
  }
 ],
 "allocated": []
}
""")
CLAIM_CONFIG_ALL_ANSWERS: dict[str, Any] = json.loads(r"""
{
 "1.35": {
  "allocations": {
   "uid-job": {
    "devices": {
     "results": [
      {
       "request": "r0",
       "driver": "a.example.com",
       "pool": "pool-0",
       "device": "dev-0"
      }
     ],
     "config": [
      {
       "source": "FromClaim",
       "opaque": {
        "driver": "a.example.com",
        "parameters": {
         "claim": true
        }
       }
      }
     ]
    },
    "nodeSelector": {
     "nodeSelectorTerms": [
      {
       "matchFields": [
        {
         "key": "metadata.name",
         "operator": "In",
         "values": [
          "node-a"
         ]
        }
       ]
      }
     ]
    }
   }
  }
 },
 "1.37": {
  "allocations": {
   "uid-job": {
    "devices": {
     "results": [
      {
       "request": "r0",
       "driver": "a.example.com",
       "pool": "pool-0",
       "device": "dev-0"
      }
     ],
     "config": [
      {
       "source": "FromClaim",
       "opaque": {
        "driver": "a.example.com",
        "parameters": {
         "claim": true
        }
       }
      }
     ]
    },
    "nodeSelector": {
     "nodeSelectorTerms": [
      {
       "matchFields": [
        {
         "key": "metadata.name",
         "operator": "In",
         "values": [
          "node-a"
         ]
        }
       ]
      }
     ]
    }
   }
  }
 }
}
""")


# 1.35 (DRAPartitionableDevices off): an All subrequest over a pool in which one device
# consumes counters. The allocator counts that device in "all" and then cannot allocate it, so
# the claim does not fit; explain left the device out and allocated the rest.
COUNTERS_OFF_ALL: dict[str, Any] = json.loads(r"""
{
 "node": "node-a",
 "labels": {
  "kubernetes.io/hostname": "node-a",
  "zone": "z1"
 },
 "claim": {
  "apiVersion": "resource.k8s.io/v1",
  "kind": "ResourceClaim",
  "metadata": {
   "name": "job-0",
   "namespace": "default",
   "uid": "uid-job-0"
  },
  "spec": {
   "devices": {
    "requests": [
     {
      "name": "r0",
      "firstAvailable": [
       {
        "name": "s0",
        "deviceClassName": "class-0",
        "allocationMode": "All"
       }
      ]
     }
    ]
   }
  }
 },
 "classes": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "DeviceClass",
   "metadata": {
    "name": "class-0"
   },
   "spec": {}
  }
 ],
 "slices": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-0-a0"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-0",
     "generation": 1,
     "resourceSliceCount": 2
    },
    "sharedCounters": [
     {
      "name": "cs0",
      "counters": {
       "mem": {
        "value": "1"
       }
      }
     },
     {
      "name": "cs1",
      "counters": {
       "mem": {
        "value": "1"
       }
      }
     }
    ]
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-0-a1"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-0",
     "generation": 1,
     "resourceSliceCount": 2
    },
    "devices": [
     {
      "name": "dev-0",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      },
      "consumesCounters": [
       {
        "counterSet": "cs0",
        "counters": {
         "mem": {
          "value": "1"
         }
        }
       }
      ]
     },
     {
      "name": "dev-1",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      }
     },
     {
      "name": "dev-2",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      },
      "taints": [
       {
        "key": "k1",
        "value": "",
        "effect": "NoSchedule"
       }
      ]
     },
     {
      "name": "dev-3",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      },
      "taints": [
       {
        "key": "k1",
        "value": "",
        "effect": "NoSchedule"
       }
      ]
     }
    ]
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-1-a0"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-1",
     "generation": 0,
     "resourceSliceCount": 1
    },
    "devices": [
     {
      "name": "dev-0",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      },
      "taints": [
       {
        "key": "k1",
        "value": "",
        "effect": "NoSchedule"
       }
      ]
     },
     {
      "name": "dev-1",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      }
     }
    ]
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-2-a0"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-2",
     "generation": 0,
     "resourceSliceCount": 1
    },
    "devices": [
     {
      "name": "dev-0",
      "attributes": {
       "example.com/rack": {
        "string": "r1"
       }
      },
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      },
      "taints": [
       {
        "key": "k1",
        "value": "",
        "effect": "NoSchedule"
       }
      ]
     }
    ]
   }
  }
 ],
 "allocated": []
}
""")
COUNTERS_OFF_ALL_ANSWERS: dict[str, Any] = json.loads(r"""
{
 "1.35": {
  "unschedulable": true,
  "error": "cannot allocate all claims"
 },
 "1.37": {
  "unschedulable": true,
  "error": "cannot allocate all claims"
 }
}
""")


# 1.37: a counter set already overdrawn by an allocated device (cs0: 1 available, dev-2 holds
# 2) makes the allocator refuse every device of the pool that consumes counters, dev-3 (cs1
# only) included: it checks all the pool's counter sets. explain checked the device's own.
OVERDRAWN_COUNTER_SET: dict[str, Any] = json.loads(r"""
{
 "node": "node-a",
 "labels": {
  "kubernetes.io/hostname": "node-a",
  "zone": "z1"
 },
 "claim": {
  "apiVersion": "resource.k8s.io/v1",
  "kind": "ResourceClaim",
  "metadata": {
   "name": "job-0",
   "namespace": "default",
   "uid": "uid-job-0"
  },
  "spec": {
   "devices": {
    "requests": [
     {
      "name": "r0",
      "exactly": {
       "deviceClassName": "class-0",
       "allocationMode": "ExactCount",
       "count": 1,
       "capacity": {
        "requests": {
         "memory": "1Gi"
        }
       }
      }
     }
    ]
   }
  }
 },
 "classes": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "DeviceClass",
   "metadata": {
    "name": "class-0"
   },
   "spec": {}
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "DeviceClass",
   "metadata": {
    "name": "class-1"
   },
   "spec": {}
  }
 ],
 "slices": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-0-a0"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-0",
     "generation": 0,
     "resourceSliceCount": 3
    },
    "sharedCounters": [
     {
      "name": "cs0",
      "counters": {
       "mem": {
        "value": "1"
       }
      }
     },
     {
      "name": "cs1",
      "counters": {
       "mem": {
        "value": "1"
       }
      }
     }
    ]
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-0-a2"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-0",
     "generation": 0,
     "resourceSliceCount": 3
    },
    "devices": [
     {
      "name": "dev-2",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      },
      "consumesCounters": [
       {
        "counterSet": "cs0",
        "counters": {
         "mem": {
          "value": "2"
         }
        }
       }
      ]
     },
     {
      "name": "dev-3",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      },
      "consumesCounters": [
       {
        "counterSet": "cs1",
        "counters": {
         "mem": {
          "value": "1"
         }
        }
       }
      ]
     },
     {
      "name": "dev-4",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      }
     }
    ]
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-0-a1"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-0",
     "generation": 0,
     "resourceSliceCount": 3
    },
    "devices": [
     {
      "name": "dev-0",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      },
      "taints": [
       {
        "key": "k1",
        "value": "",
        "effect": "NoSchedule"
       }
      ]
     },
     {
      "name": "dev-1",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      },
      "consumesCounters": [
       {
        "counterSet": "cs0",
        "counters": {
         "mem": {
          "value": "1"
         }
        }
       }
      ]
     }
    ]
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-1-a0"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-1",
     "generation": 0,
     "resourceSliceCount": 1
    },
    "devices": [
     {
      "name": "dev-0",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      },
      "taints": [
       {
        "key": "k1",
        "value": "",
        "effect": "NoSchedule"
       }
      ]
     }
    ]
   }
  }
 ],
 "allocated": [
  {
   "driver": "a.example.com",
   "pool": "pool-0",
   "device": "dev-2"
  }
 ]
}
""")
OVERDRAWN_COUNTER_SET_ANSWERS: dict[str, Any] = json.loads(r"""
{
 "1.37": {
  "allocations": {
   "uid-job-0": {
    "devices": {
     "results": [
      {
       "request": "r0",
       "driver": "a.example.com",
       "pool": "pool-0",
       "device": "dev-4",
       "shareID": "613ca675-f0fd-4dac-a118-06a3f932fe5c",
       "consumedCapacity": {
        "memory": "1Gi"
       }
      }
     ]
    },
    "nodeSelector": {
     "nodeSelectorTerms": [
      {
       "matchFields": [
        {
         "key": "metadata.name",
         "operator": "In",
         "values": [
          "node-a"
         ]
        }
       ]
      }
     ]
    }
   }
  }
 }
}
""")


# Two claims of one pod: job-0 takes all three devices; job-1's admin-access request may share
# one, its other request cannot. explain's undo of the admin-access choice dropped job-0's hold,
# so the other request then took a device job-0 held, and the pod "fitted".
ADMIN_UNDO_KEEPS_HOLD: dict[str, Any] = json.loads(r"""
{
 "node": "node-a",
 "labels": {
  "kubernetes.io/hostname": "node-a",
  "zone": "z1"
 },
 "claims": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceClaim",
   "metadata": {
    "name": "job-0",
    "namespace": "default",
    "uid": "uid-job-0"
   },
   "spec": {
    "devices": {
     "requests": [
      {
       "name": "r0",
       "exactly": {
        "deviceClassName": "class-0",
        "allocationMode": "All"
       }
      }
     ]
    }
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceClaim",
   "metadata": {
    "name": "job-1",
    "namespace": "default",
    "uid": "uid-job-1"
   },
   "spec": {
    "devices": {
     "requests": [
      {
       "name": "r0",
       "exactly": {
        "deviceClassName": "class-0",
        "allocationMode": "ExactCount",
        "count": 1,
        "adminAccess": true,
        "capacity": {
         "requests": {
          "memory": "1Gi"
         }
        }
       }
      },
      {
       "name": "r1",
       "exactly": {
        "deviceClassName": "class-0",
        "allocationMode": "ExactCount",
        "count": 1
       }
      }
     ]
    }
   }
  }
 ],
 "classes": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "DeviceClass",
   "metadata": {
    "name": "class-0"
   },
   "spec": {}
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "DeviceClass",
   "metadata": {
    "name": "class-1"
   },
   "spec": {}
  }
 ],
 "slices": [
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-0-a0"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-0",
     "generation": 0,
     "resourceSliceCount": 2
    },
    "sharedCounters": [
     {
      "name": "cs0",
      "counters": {
       "mem": {
        "value": "1"
       }
      }
     },
     {
      "name": "cs1",
      "counters": {
       "mem": {
        "value": "1"
       }
      }
     }
    ]
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-0-a1"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-0",
     "generation": 0,
     "resourceSliceCount": 2
    },
    "devices": [
     {
      "name": "dev-0",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      },
      "taints": [
       {
        "key": "k1",
        "value": "",
        "effect": "NoSchedule"
       }
      ]
     }
    ]
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-1-a0"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-1",
     "generation": 0,
     "resourceSliceCount": 2
    },
    "sharedCounters": [
     {
      "name": "cs0",
      "counters": {
       "mem": {
        "value": "1"
       }
      }
     },
     {
      "name": "cs1",
      "counters": {
       "mem": {
        "value": "1"
       }
      }
     }
    ]
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-1-a1"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-1",
     "generation": 0,
     "resourceSliceCount": 2
    },
    "devices": [
     {
      "name": "dev-0",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      }
     }
    ]
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-2-a0"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-2",
     "generation": 0,
     "resourceSliceCount": 2
    },
    "sharedCounters": [
     {
      "name": "cs0",
      "counters": {
       "mem": {
        "value": "1"
       }
      }
     },
     {
      "name": "cs1",
      "counters": {
       "mem": {
        "value": "1"
       }
      }
     }
    ]
   }
  },
  {
   "apiVersion": "resource.k8s.io/v1",
   "kind": "ResourceSlice",
   "metadata": {
    "name": "a.example.com-pool-2-a1"
   },
   "spec": {
    "driver": "a.example.com",
    "nodeName": "node-a",
    "pool": {
     "name": "pool-2",
     "generation": 0,
     "resourceSliceCount": 2
    },
    "devices": [
     {
      "name": "dev-0",
      "allowMultipleAllocations": true,
      "capacity": {
       "memory": {
        "value": "8Gi"
       }
      },
      "taints": [
       {
        "key": "k1",
        "value": "",
        "effect": "NoSchedule"
       }
      ]
     }
    ]
   }
  }
 ],
 "allocated": []
}
""")
ADMIN_UNDO_KEEPS_HOLD_ANSWERS: dict[str, Any] = json.loads(r"""
{
 "1.35": {
  "unschedulable": true,
  "error": "cannot allocate all claims"
 },
 "1.37": {
  "unschedulable": true,
  "error": "cannot allocate all claims"
 }
}
""")


CASES = [
    pytest.param(CLASS_CONFIG, CLASS_CONFIG_ANSWERS, "1.37", id="class-config-1.37"),
    pytest.param(CLASS_CONFIG, CLASS_CONFIG_ANSWERS, "1.35", id="class-config-1.35"),
    pytest.param(ALL_SUBREQUEST, ALL_SUBREQUEST_ANSWERS, "1.37", id="all-subrequest-1.37"),
    pytest.param(ALL_SUBREQUEST, ALL_SUBREQUEST_ANSWERS, "1.35", id="all-subrequest-1.35"),
    pytest.param(CLAIM_CONFIG_ALL, CLAIM_CONFIG_ALL_ANSWERS, "1.37", id="claim-config-all-1.37"),
    pytest.param(CLAIM_CONFIG_ALL, CLAIM_CONFIG_ALL_ANSWERS, "1.35", id="claim-config-all-1.35"),
    pytest.param(COUNTERS_OFF_ALL, COUNTERS_OFF_ALL_ANSWERS, "1.37", id="counters-off-all-1.37"),
    pytest.param(COUNTERS_OFF_ALL, COUNTERS_OFF_ALL_ANSWERS, "1.35", id="counters-off-all-1.35"),
    pytest.param(OVERDRAWN_COUNTER_SET, OVERDRAWN_COUNTER_SET_ANSWERS, "1.37",
                 id="overdrawn-counter-set-1.37"),
    pytest.param(ADMIN_UNDO_KEEPS_HOLD, ADMIN_UNDO_KEEPS_HOLD_ANSWERS, "1.37",
                 id="admin-undo-keeps-hold-1.37"),
    pytest.param(ADMIN_UNDO_KEEPS_HOLD, ADMIN_UNDO_KEEPS_HOLD_ANSWERS, "1.35",
                 id="admin-undo-keeps-hold-1.35"),
]


@pytest.mark.parametrize(("case", "answers", "minor"), CASES)
def test_explain_gives_the_allocators_answer(case: dict[str, Any], answers: dict[str, Any],
                                             minor: str) -> None:
    expected = answer_of_allocator(answers[minor], uids_of(case))
    got = answer_of_explain(explain_case(case, FEATURES[minor]))
    assert compare(expected, got) is None, compare(expected, got)
